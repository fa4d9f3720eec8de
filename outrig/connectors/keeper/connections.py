"""The warm connections as the CLI and the settings see them: how long one is kept
(``OUTRIG_KEEP_SECONDS``), which are open, and closing them (``outrig connections``).

The one public face of the keeper wing: callers outside ``connectors/keeper/`` import from
here, so the client's internals can change without reaching into the command line.
"""

from __future__ import annotations

from outrig.connectors.keeper.client import (
    KEEP_ENV,
    close_keepers,
    env_keep_seconds,
    keepers,
    older_keepers,
    wait_closed,
)

__all__ = ["KEEP_ENV", "close_keepers", "env_keep_seconds", "keepers", "older_keepers",
           "wait_closed"]
