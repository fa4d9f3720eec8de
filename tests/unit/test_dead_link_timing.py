"""The rule that a kept link found dead costs no more than the direct path's first silent
connect (outrig/timing.py): the keepalive limit never exceeds the connect limit, and the
warm path's whole wait for a dead link is never longer than the direct path's."""

from __future__ import annotations

import pytest

from outrig.inventory import Host
from outrig.timing import (
    connect_timeout_for,
    dead_link_limit,
    keepalive_limit_for,
    probe_idle_after,
)

HOST = Host(name="box", hostname="10.0.0.1", workdir="/w", python="python3")


@pytest.mark.parametrize("rtt", [None, 0.0005, 0.01, 0.24, 0.6, 1.0, 3.0])
@pytest.mark.parametrize("override", [None, 2.0, 60.0])
def test_the_kept_path_never_waits_longer_for_a_dead_link(rtt: float | None,
                                                          override: float | None) -> None:
    host = Host(name="box", hostname="10.0.0.1", workdir="/w", python="python3",
                connect_timeout=override)
    keepalive, why = keepalive_limit_for(host, rtt)
    connect, _ = connect_timeout_for(host, rtt)
    assert keepalive <= connect and why
    assert dead_link_limit(host, rtt, kept=True) <= dead_link_limit(host, rtt, kept=False)


def test_the_keepalive_limit_is_a_few_rtts_above_its_floor() -> None:
    assert keepalive_limit_for(HOST, 0.01)[0] == 5.0  # the floor: a loaded sshd may be slow
    assert keepalive_limit_for(HOST, 1.0)[0] == 8.0  # 8 RTTs
    assert keepalive_limit_for(HOST, 3.0)[0] == 24.0 < connect_timeout_for(HOST, 3.0)[0]
    limit, why = keepalive_limit_for(HOST, 0.24)
    assert (limit, why) == (5.0, "max(5 s, 8 × measured RTT 240 ms)")


def test_a_link_heard_from_within_a_few_rtts_is_not_probed_again() -> None:
    assert probe_idle_after(0.24) == pytest.approx(0.96)
    assert probe_idle_after(None) == 0.0  # no RTT known: always probe


def test_the_numbers_the_docs_give() -> None:
    # docs/reliability.md: a dead LAN box, 10 ms RTT, no connect_timeout: in the host file
    assert dead_link_limit(HOST, 0.01, kept=False) == pytest.approx(30.24)
    assert dead_link_limit(HOST, 0.01, kept=True) == pytest.approx(20.0)
