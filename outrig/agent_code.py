"""The box agent's own code on the workstation: the one module through which outrig imports
what it shares with the agent (``remote/agent/``, docs/agent-protocol.md).

Sharing the agent's code, rather than a copy of it, is what keeps the two sides of the
protocol from drifting apart. What is shared, and why:

- ``protocol``: the version and every op's request fields; the workstation checks each request
  with the agent's own ``request_problems`` before it leaves (a misspelt field is a bad request
  that never reaches the box) and encodes it with ``encode_request``;
- ``bundle``: how the agent is packed, sent and started (the workstation builds the bundle);
- ``transfer``: manifests and the frame stream: the workstation runs the agent's own sender
  and receiver, so a copy to or from a box speaks one format;
- ``AgentError`` and ``redact`` (``events``): the box's error as the shared frame code raises
  it here too, and the one secret redaction for what is shown from a box;
- ``read_stat`` (``procs``): the one ``/proc/PID/stat`` parser (the sandbox's processes);
- ``LAUNCH_ENV_KEYS`` (``constants``): the variables the agent sets in every process it
  launches (the run's markers), which the planner refuses in a playbook's ``env:``;
- ``parse_prompt_lines``, ``prompts_digest`` (``bench``): an evaluation's prompt file, read
  as the box reads it, and the prompt set's identity, computed as the box computes it;
- ``serve``: the live agent's frames (``frame``, ``FrameBuffer``): the keeper speaks to the
  box's resident agent with the box's own framing (``outrig/connectors/keeper/live.py``);
- ``gpu_judge``: the GPU health judge; the box's deploy refuses a ``bad`` GPU with it and the
  workstation judges the same raw fields with it (``outrig/hosts/gpu_health.py``);
- :func:`examples_dir`: the examples shipped beside the agent (``outrig demo``'s playbook and
  trainer), found from the agent's own files so a wheel and a checkout both have them.

Where the code lives: ``remote/`` at the top of the source tree, shipped as ``outrig._box``.
That mapping is stated once, in pyproject.toml (``[tool.setuptools.package-dir]``); the wheel
and the editable install both follow it, so at run time this module imports the installed
name. mypy cannot follow a package-dir mapping, so for the type checker the same files are
named by their place in the tree (``remote.agent``); mypy checks them there, as the agent.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the files where the tree has them (pyproject.toml's mypy `files`)
    from remote.agent import (
        bench,
        bundle,
        constants,
        events,
        gpu_judge,
        procs,
        protocol,
        serve,
        transfer,
    )
else:  # their installed name
    from outrig._box.agent import (
        bench,
        bundle,
        constants,
        events,
        gpu_judge,
        procs,
        protocol,
        serve,
        transfer,
    )

BAD_REQUEST = protocol.BAD_REQUEST
PROTOCOL_VERSION = protocol.PROTOCOL_VERSION
encode_request = protocol.encode_request
request_problems = protocol.request_problems
AgentError = events.AgentError
redact = events.redact
read_stat = procs.read_stat
LAUNCH_ENV_KEYS = constants.LAUNCH_ENV_KEYS
parse_prompt_lines = bench.parse_prompt_lines
prompts_digest = bench.prompts_digest



def examples_dir() -> Path:
    """``remote/examples`` (``outrig._box.examples`` in the wheel): the demo's smoke playbook and
    its trainer, the folder beside the agent package."""
    return Path(bundle.__file__).resolve().parent.parent / "examples"


__all__ = ["BAD_REQUEST", "LAUNCH_ENV_KEYS", "PROTOCOL_VERSION", "AgentError", "bundle",
           "encode_request", "examples_dir", "gpu_judge", "parse_prompt_lines",
           "prompts_digest", "read_stat",
           "redact", "request_problems", "serve", "transfer"]
