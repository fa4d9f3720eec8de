"""Operations: each user-facing command, orchestrating inventory → plan → agent → journal.

Only this package, the session layer under it (:mod:`outrig.session`, :mod:`outrig.fanout`)
and the connectors (:mod:`outrig.transport`, :mod:`outrig.connectors`) touch the network.
Each op has a core that takes an open :class:`~outrig.session.HostSession` (``status_on``,
``deploy_on``, ...) and a plain function taking a :class:`~outrig.session.Project`, a
``--host`` string and a :class:`~outrig.console.Reporter` that opens one session and calls the
core, so it can be called from ``tasks.py``, from tests, or from another program; a command
on two boxes composes cores over one session per box. What several ops share about runs is
:mod:`outrig.ops.runs`.
"""
