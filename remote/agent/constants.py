"""Settings shared by the agent's modules: timings, limits and the environment keys that mark
what outrig launched."""

from __future__ import annotations

import errno
import re
from typing import Any, Dict

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
POLL_S = 0.05  # how often stop loops re-check /proc
TICK_S = 0.1  # how often the readiness loop looks at logs and exits
COMPLETION_TIMEOUT_S = 30.0  # ready.generate: the first real request (a CPU engine is slow)
FATAL_AFTER_REFUSAL_S = 2.0  # ready.generate refused: how long the log may take to say why
CENSUS_EVERY_S = 0.5  # deploy's wait records the run's processes (pid + start) this often
PROBE_EVERY_S = 0.5  # http/port readiness retry period (protocol: every 0.5 s)
PROBE_TIMEOUT_S = 1.0  # http/port readiness per-try timeout (protocol: 1 s)
KILL_WAIT_S = 10.0  # bounded wait for SIGKILLed processes to vanish (protocol: 10 s)
EXCERPT_LINES = 20
MAX_LINE_CHARS = 2000  # lines longer than this are cut in events (tqdm bars, JSON dumps)
TAIL_MAX_BYTES = 4 << 20  # never scan more than this backwards for a tail
FOLLOW_CHUNK = 1 << 20  # read at most this much new log per process per tick
DEFAULT_READY_TIMEOUT = 300.0
# A process without ``ready:`` must still be seen alive this long (and not have exited non-zero)
# before deploy says it started: a missing binary exits 127 in milliseconds, a bad import in
# about a second. Requests may set ``settle`` (seconds) to change it.
DEFAULT_SETTLE_S = 2.0
STOP_HEARTBEAT_S = 2.0
DEFAULT_STOP_GRACE = 10.0
CHILDREN_FIRST_LAUNCHER_S = 15.0  # after its workers are gone, the launcher's time to exit
MARKER_KEY = "OUTRIG_RUN"
PROCESS_KEY = "OUTRIG_PROCESS"
CGROUP_KEY = "OUTRIG_CGROUP_PROCS"  # read (and removed) by the wrapper
CGROUP_SWITCH = "OUTRIG_CGROUPS"  # "0" in the host's env: never create cgroups
# What the agent itself puts in the environment of every process it launches. A playbook may
# not set them (outrig/plan.py refuses them: a value of its own would be overwritten, or would
# mark a process as another run's). None starts with VLLM_: vLLM warns about every VLLM_* name
# it does not know (vllm/envs.py validate_environ) and refuses to start on one with
# --fail-on-environ-validation, so outrig's names must never take that prefix.
LAUNCH_ENV_KEYS = (MARKER_KEY, PROCESS_KEY, CGROUP_KEY)
DESCENDANTS_FILE = "descendants.json"
SWEEP_NAME = "(marker sweep)"
CGROUP_SWEEP_NAME = "(cgroup sweep)"


JSONDict = Dict[str, Any]


FULL_DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG)
