"""Every workstation-side time limit that depends on the link, in one place.

A 240 ms link and a LAN need different limits: a fixed 5 s limit fires on a slow link that
works, and a fixed 60 s one hides a dead LAN box for a minute. Each rule here scales with the
round-trip time (RTT) measured on the last contact (kept in the journal) or on this
connection, and never goes below a floor that a loaded box can need. A limit that comes with a
"why" sentence is named in the error it raises, so a user can see where it came from.

Nothing here does I/O: these are pure functions of the RTT (and the host file's override).
"""

from __future__ import annotations

import random

from outrig.inventory import Host
from outrig.transport import SILENT_ATTEMPTS

DEFAULT_CONNECT_TIMEOUT = 15.0  # seconds; also the floor of the RTT-scaled connect limit
CHANNEL_TIMEOUT_FLOOR = 5.0  # seconds; below this a loaded box's sshd may simply be slow
AGENT_IDLE_FLOOR = 60.0  # seconds of silence before an agent call's link counts as dead
FORWARD_OPEN_TIMEOUT = 20.0  # seconds for the box to answer a forwarded channel's open
MIGRATE_PROBE_PAUSE = 2.0  # seconds between migrate's probes of the old box (× attempt)
TCP_PROBE_LIMIT = 10.0  # seconds at most for migrate's bare TCP probe of the old box


def _rtt_scaled(host: Host, rtt: float | None, floor: float, times: int,
                which: str) -> tuple[float, str]:
    """A limit and the sentence saying where it came from (for the error message): the host
    file's connect_timeout, else ``times`` × the measured RTT but never below ``floor``."""
    if host.connect_timeout is not None:
        return host.connect_timeout, "connect_timeout in the host file"
    if rtt is None:
        return DEFAULT_CONNECT_TIMEOUT, "default; no RTT measured yet for this host"
    return (max(floor, times * rtt),
            f"max({floor:g} s, {times} × {which} RTT {rtt * 1000:.0f} ms)")


def connect_timeout_for(host: Host, rtt: float | None) -> tuple[float, str]:
    """The connect limit and a sentence saying where it came from (for the error message)."""
    return _rtt_scaled(host, rtt, DEFAULT_CONNECT_TIMEOUT, 30, "last measured")


def channel_timeout_for(host: Host, rtt: float | None) -> tuple[float, str]:
    """How long a session-channel open may take once authenticated: one round trip, so a
    generous multiple of the measured RTT (never below a floor a loaded sshd can need)."""
    return _rtt_scaled(host, rtt, CHANNEL_TIMEOUT_FLOOR, 20, "measured")


KEEPALIVE_RTTS = 8  # a kept link's keepalive may take this many RTTs (never below the floor)
PROBE_IDLE_RTTS = 4  # a kept link not heard from for this many RTTs is probed before it is lent


def keepalive_limit_for(host: Host, rtt: float | None) -> tuple[float, str]:
    """How long a kept link (the keeper's) may take to answer a keepalive before a channel on
    it is lent: a few RTTs, never below the channel-open floor, and never above the connect
    limit. Why the cap: a kept link found silent counts as one of the silent connect
    attempts (:data:`~outrig.transport.SILENT_ATTEMPTS`) the direct path would have spent, so
    a command through the keeper never takes longer to report a dead link than a direct one
    (:func:`dead_link_limit`)."""
    limit, why = _rtt_scaled(host, rtt, CHANNEL_TIMEOUT_FLOOR, KEEPALIVE_RTTS, "measured")
    connect, _ = connect_timeout_for(host, rtt)
    if limit > connect:
        return connect, f"the connect limit ({why} would be longer)"
    return limit, why


def probe_idle_after(rtt: float | None) -> float:
    """Silence after which a kept link is probed before it is lent: a few RTTs. A link heard
    from more recently (a channel's output, an answered keepalive) was alive a moment ago;
    one idle for longer may have died unseen (a kept TCP connection shows nothing until
    something is sent), and lending it would leave the command to wait out the mid-call limit
    (:func:`agent_idle_limit`, a minute) instead of a few RTTs."""
    return PROBE_IDLE_RTTS * (rtt or 0.0)


LIVE_SILENT_BEATS = 10  # heartbeats a live agent may miss before it counts as stopped
LIVE_SILENT_FLOOR = 3.0  # seconds, at least: a loaded box's agent may miss a few on a LAN


def live_silence_limit(heartbeat: float, rtt: float | None) -> float:
    """How long the box's live agent (the keeper's resident agent) may send nothing, not even
    its heartbeat, before the keeper judges it: a few heartbeats plus the link's delay. Then
    a keepalive says whether the link (dead: every request is lost contact) or the agent
    (stopped or starved: dropped, its requests not yet started go the exec path) is silent.
    It is also how long a request may wait to be started by it. Never below
    :data:`LIVE_SILENT_FLOOR` (a spurious drop costs a call the exec path and a fresh agent)."""
    return max(LIVE_SILENT_FLOOR, LIVE_SILENT_BEATS * heartbeat) + 2 * (rtt or 0.0)


def dead_link_limit(host: Host, rtt: float | None, *, kept: bool,
                    silent_attempts: int = SILENT_ATTEMPTS) -> float:
    """The longest a command waits before it reports a link that is already dead: the
    direct path spends ``silent_attempts`` connect limits and the pauses between them; the
    kept path one keepalive limit in place of the first connect (the fresh connection
    follows the refusal at once). The connectors follow this
    rule; it is spelled out here so that a test and the bench can hold the two side by side."""
    connect, _ = connect_timeout_for(host, rtt)
    connects = silent_attempts - 1 if kept else silent_attempts
    # the pauses between the connects (at the top of their jitter); none after the probe
    pauses = sum(1.2 * _pause(rtt, n) for n in range(1, connects))
    first = keepalive_limit_for(host, rtt)[0] if kept else 0.0
    return first + connects * connect + pauses


def keepalive_interval_for(rtt: float | None) -> int:
    """SSH keepalive period: a dead link shows within ~3 intervals, never fires on a slow one."""
    if rtt is None:
        return 10
    return max(5, round(10 * rtt))


def retry_pause(rtt: float | None, attempt: int) -> float:
    """The wait before retry ``attempt`` (1-based) after a lost link: a few round trips,
    doubling, capped at 10 s, with jitter so that many workstations do not retry in step."""
    return _pause(rtt, attempt) * random.uniform(0.8, 1.2)


def _pause(rtt: float | None, attempt: int) -> float:
    """:func:`retry_pause` before its jitter."""
    base = max(0.2, 4 * (rtt or 0.05))
    return float(min(base * 2.0 ** (attempt - 1), 10.0))


def agent_idle_limit(rtt: float | None) -> float:
    """Silence allowed on an agent call's channel. The agent speaks at least every progress
    interval while it waits; silence longer than this means the link or the box is gone."""
    return max(AGENT_IDLE_FLOOR, 40 * (rtt or 0.0))


def heartbeat_for(rtt: float | None) -> float:
    """How often the ``follow`` agent must speak when idle: often enough to see a dead link
    within a few seconds, rarely enough to cost nothing on a slow one."""
    if rtt is None:
        return 2.0
    return max(1.0, min(5.0, 5 * rtt))


def follow_idle_limit(heartbeat: float, rtt: float | None) -> float:
    """Silence longer than ~3 heartbeats (plus the link's own delay) means the link is dead."""
    return max(3.0, 3 * heartbeat + 4 * (rtt or 0.0))


def jittered(delay: float) -> float:
    """``delay`` ± 20 %: reconnect waits of many workstations do not line up."""
    return delay * random.uniform(0.8, 1.2)


FANOUT_CALL_FLOOR = 10.0  # seconds an agent call of a fanned-out command gets beyond connect


def fanout_deadline_for(host: Host, rtt: float | None, work: float = 0.0) -> tuple[float, str]:
    """How long one host of a command run on several hosts at once may take before it is
    reported as giving no answer (and the others' results are shown without it): the
    connect limit, then one agent call (``max(10 s, 40 × RTT)``), plus ``work``, the op's
    own wait on the box (cleanup's GPU wait). Returns the limit and where it came from."""
    connect, why = connect_timeout_for(host, rtt)
    call = max(FANOUT_CALL_FLOOR, 40 * (rtt or 0.0))
    total = connect + call + work
    extra = f" + {work:g} s of waiting on the box" if work else ""
    return total, f"connect {connect:g} s ({why}) + call {call:g} s{extra}"
