"""Hangs: a process that lives but does no work any more (docs/watch.md#hangs).

``spec.py`` is the playbook's ``hang:`` section (which signals, their bounds, the
confirmations each needs); ``judge.py`` is the pure judge that turns what the agent sampled
on the box into a verdict per process; ``store.py`` keeps the judge's state per run in the
journal, so that ``watch`` and ``status`` count the same confirmations.
"""
