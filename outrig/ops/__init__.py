"""Operations: each user-facing command, orchestrating inventory → plan → agent → journal.

Only this package and :mod:`outrig.transport` touch the network. Each op is a plain function
taking a :class:`~outrig.ops.base.Project` and a :class:`~outrig.console.Reporter`, so it can
be called from ``tasks.py``, from tests, or from another program.
"""
