"""Calling the box agent (the agent itself is ``remote/agent/``, run on the box; its code and
bundle come through :mod:`outrig.agent_code`): one call over a channel, run or kept live
(:mod:`.client`), and the one reader of an agent's channel (:mod:`.reader`). Both run in the
command's own process."""
