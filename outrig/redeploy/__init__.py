"""A run deployed again exactly as it was: after a move to a spare (``migrate``, ``watch``'s
automatic move) or a restart in place (``watch --restarts``).

Every deploy writes a *move record* into the run's journal record (:mod:`.record`): the
playbook's text as deployed, the ``--param`` overrides, ``--test``, and the address of the
box (everything a connection needs, never a secret). A redeploy rebuilds its inputs from that
record (:mod:`.rebuild`), not from today's files, and names every difference (the playbook
file changed since, a ``--param`` given again on the command line, which wins); a box whose
host file is gone is reached at the address the record holds.
"""
