"""The warm connection: a keeper process per host holds the SSH link for later commands.

Which process runs what: the command's side is :mod:`~outrig.connectors.keeper.client` (the
``ssh`` connector when keeping is on); the keeper process itself is
:mod:`~outrig.connectors.keeper.daemon`, started by :mod:`~outrig.connectors.keeper.launch`,
with its link probe (:mod:`~outrig.connectors.keeper.link_probe`) and the resident agent it
relays to (:mod:`~outrig.connectors.keeper.live`); both sides speak
:mod:`~outrig.connectors.keeper.wire`. The CLI and the settings use only
:mod:`~outrig.connectors.keeper.connections`.
"""
