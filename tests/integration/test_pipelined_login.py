"""The pipelined login (outrig/connectors/ssh/pipelined_login.py) against the real sshd, counted by
the latency proxy: one client turn fewer before the exec, the same refusal for a wrong key,
nothing sent under the session keys for a changed host key, and paramiko's own sequence again
after a pipelined login was cut."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from outrig.connectors.ssh.preconnect import CLIENT_BANNER
from outrig.connectors.ssh.transport import SSHTransport
from outrig.errors import AuthRefused, HostKeyError, LinkLost
from outrig.inventory import resolve_host
from outrig.sandbox.proxy import SERVICE_REQUEST_MAX, Fault, LatencyProxy, PhaseTracker

pytestmark = pytest.mark.integration


def proxied(box_host: Path, make_proxy: Any, delay: float, **changes: Any
            ) -> tuple[Path, LatencyProxy]:
    config = yaml.safe_load(box_host.read_text())
    proxy: LatencyProxy = make_proxy(config["port"], one_way_delay=delay)
    config["port"] = proxy.port
    config.update(changes)
    path = box_host.parent / "pipelined.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, proxy


def run_true(host_file: Path, tmp_path: Path, pipeline: bool, **kwargs: Any) -> SSHTransport:
    transport = SSHTransport(resolve_host(str(host_file), hosts_dir=tmp_path),
                             pipeline=pipeline, **kwargs)
    try:
        channel = transport.start(["true"])
        assert channel.exit_status(30) == 0
    except BaseException:
        transport.close()
        raise
    return transport


def test_the_pipelined_login_saves_one_client_turn_before_the_exec(
        box_host: Path, make_proxy: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the login alone pipelined (the open waits for its answer): the layout compared here
    monkeypatch.setenv("OUTRIG_SSH_PIPELINE", "login")
    # 100 ms RTT: a reply cannot reach the client within 100 ms of its request, so
    # messages sent together can never be counted as turns of their own
    host_file, proxy = proxied(box_host, make_proxy, 0.05)
    turns = {}
    for number, pipeline in enumerate((False, True), start=1):
        transport = run_true(host_file, tmp_path, pipeline)
        try:
            link = transport.connection.transport
            assert link.pipelined_logins == (1 if pipeline else 0)
            assert (link.login_rtt is not None) == pipeline
        finally:
            transport.close()
        tracker = proxy.tracker(number)
        assert tracker.pipelined_login is pipeline
        turns[pipeline] = tracker.turn_of
    # banner, KEXINIT, key exchange, then NEWKEYS with the service request: the 4th turn, or
    # the 3rd when the server's KEXINIT was already there when paramiko started (the banner
    # left ahead, preconnect.py): then its KEXINIT and the key exchange leave together
    assert {turns[True]["auth"], turns[False]["auth"]} <= {3, 4}
    # stepwise: login, channel open, exec each wait; pipelined: the login waits no more
    assert turns[False]["channel"] - turns[False]["auth"] == 2
    assert turns[True]["channel"] - turns[True]["auth"] == 1
    assert turns[True]["exec"] - turns[True]["auth"] == \
        turns[False]["exec"] - turns[False]["auth"] - 1
    assert turns[True]["exec"] <= 6


def test_the_measured_login_rtt_is_one_round_trip(box_host: Path, make_proxy: Any,
                                                  tmp_path: Path) -> None:
    host_file, _ = proxied(box_host, make_proxy, 0.1)
    transport = run_true(host_file, tmp_path, True)
    try:
        login_rtt = transport.connection.transport.login_rtt
    finally:
        transport.close()
    assert login_rtt >= 0.2  # never less than the link's round trip
    assert login_rtt < 0.4  # and not two of them (the login itself is not waited for)


def refusal(host_file: Path, tmp_path: Path, pipeline: bool) -> str:
    transport = SSHTransport(resolve_host(str(host_file), hosts_dir=tmp_path),
                             pipeline=pipeline)
    try:
        with pytest.raises(AuthRefused) as caught:
            transport.start(["true"])
    finally:
        transport.close()
    return str(caught.value)


def test_a_wrong_key_is_refused_with_the_same_error_as_without_pipelining(
        box_host: Path, make_proxy: Any, tmp_path: Path) -> None:
    key = tmp_path / "wrong_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    host_file, proxy = proxied(box_host, make_proxy, 0.005, identity_file=str(key))
    stepwise = refusal(host_file, tmp_path, False)
    pipelined = refusal(host_file, tmp_path, True)
    assert pipelined == stepwise
    assert "authentication failed" in pipelined and "wrong_key" in pipelined
    assert proxy.accepted == 2, "a refusal is never retried"
    # the first flight under the session keys: the service request alone, then with the login
    assert proxy.tracker(1).first_flight_bytes <= SERVICE_REQUEST_MAX
    assert proxy.tracker(2).first_flight_bytes > SERVICE_REQUEST_MAX


def test_a_changed_host_key_is_refused_before_anything_is_encrypted(
        box_host: Path, make_proxy: Any, tmp_path: Path) -> None:
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)],
                   check=True)
    host_file, proxy = proxied(box_host, make_proxy, 0.005)
    config = yaml.safe_load(host_file.read_text())
    public = (tmp_path / "other_key.pub").read_text().split()
    known = Path(config["known_hosts"])
    known.parent.mkdir(parents=True, exist_ok=True)
    known.write_text(f"[127.0.0.1]:{proxy.port} {public[0]} {public[1]}\n")
    transport = SSHTransport(resolve_host(str(host_file), hosts_dir=tmp_path), pipeline=True)
    try:
        with pytest.raises(HostKeyError, match="CHANGED"):
            transport.start(["true"])
    finally:
        transport.close()
    tracker = proxy.tracker(1)
    assert "kex" in tracker.turn_of
    # no service request, no login: not one byte under the session keys
    assert tracker.flights == 0 and "auth" not in tracker.turn_of
    assert proxy.accepted == 1


def test_a_cut_pipelined_login_is_retried_with_paramikos_own_sequence(
        box_host: Path, make_proxy: Any, tmp_path: Path) -> None:
    host_file, proxy = proxied(box_host, make_proxy, 0.005)
    proxy.inject(Fault(phase="auth"))
    transport = run_true(host_file, tmp_path, True)
    try:
        assert transport.link_failures == 1 and transport.pipeline is False
        assert transport.connection.transport.pipelined_logins == 0
    finally:
        transport.close()
    assert proxy.fired == [(1, "auth", "cut")]
    assert proxy.tracker(2).pipelined_login is False


def test_pipelining_is_off_with_the_environment_switch(
        box_host: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OUTRIG_SSH_PIPELINE", "0")
    transport = SSHTransport(resolve_host(str(box_host), hosts_dir=tmp_path))
    assert transport.pipeline is False
    try:
        channel = transport.start(["true"])
        assert channel.exit_status(30) == 0
        assert transport.connection.transport.pipelined_logins == 0
    finally:
        transport.close()


def flight(tracker: PhaseTracker, data: bytes) -> dict[str, int]:
    """One client flight after the server spoke (and its bytes were handed over)."""
    tracker.handed_to_client()
    tracker.feed("s2c", b"server bytes")
    return tracker.feed("c2s", data)


def test_phase_tracker_reads_a_pipelined_login_by_its_size() -> None:
    tracker = PhaseTracker()
    tracker.feed("c2s", b"SSH-2.0-paramiko\r\n")
    tracker.handed_to_client()
    tracker.feed("s2c", b"SSH-2.0-OpenSSH_9\r\n")
    newkeys = b"\x00\x00\x00\x0c\x0a\x15" + b"\x00" * 10
    login = b"L" * (SERVICE_REQUEST_MAX + 1)  # the service request and a signed login
    assert tracker.feed("c2s", newkeys + login[:40]) == {"kex": 0, "auth": len(newkeys)}
    assert tracker.feed("c2s", login[40:]) == {}  # the same flight: no turn of its own
    assert flight(tracker, b"open") == {"channel": 0}
    assert tracker.pipelined_login is True
    assert flight(tracker, b"exec") == {"exec": 0}
    assert tracker.feed("s2c", b"output") == {"stream": 0}
    assert tracker.turn_of == {"banner": 1, "kex": 2, "auth": 2, "channel": 3, "exec": 4,
                               "stream": 4}


def test_the_channel_open_behind_the_login_saves_one_more_turn(
        box_host: Path, make_proxy: Any, tmp_path: Path) -> None:
    """The default: the session-channel open leaves with the login; the exec then goes out
    in the next flight, one turn before the login-only layout's
    (``OUTRIG_SSH_PIPELINE=login``)."""
    host_file, proxy = proxied(box_host, make_proxy, 0.05)
    flights = {}
    for number, early in enumerate((False, True), start=1):
        proxy.early_channel = early  # how the proxy names the flights of this connection
        transport = run_true(host_file, tmp_path, True,
                             early_channel=None if early else False)  # None: the default
        try:
            link = transport.connection.transport
            assert link.early_channels == (1 if early else 0)
            assert transport.rtt is not None and transport.rtt >= 0.1  # one round trip
        finally:
            transport.close()
        flights[early] = proxy.tracker(number).flight_turns
    # login only: [login], [open], [exec]; with the open behind the login: [login, open], [exec]
    # (counted from each connection's login flight: the turns before it can differ by one,
    # see the test above)
    assert flights[True][1] - flights[True][0] == 1
    assert flights[False][2] - flights[False][0] == 2
    early, stepwise = proxy.tracker(2).turn_of, proxy.tracker(1).turn_of
    assert "channel" not in early and early["exec"] - early["auth"] == 1
    assert stepwise["exec"] - stepwise["auth"] == 2


def test_phase_tracker_reads_the_exec_as_the_second_flight_behind_an_early_open() -> None:
    tracker = PhaseTracker(early_channel=True)
    tracker.feed("c2s", b"SSH-2.0-paramiko\r\n")
    tracker.handed_to_client()
    tracker.feed("s2c", b"SSH-2.0-OpenSSH_9\r\n")
    newkeys = b"\x00\x00\x00\x0c\x0a\x15" + b"\x00" * 10
    flight_1 = b"L" * (SERVICE_REQUEST_MAX + 100)  # the service request, the login, the open
    assert tracker.feed("c2s", newkeys + flight_1) == {"kex": 0, "auth": len(newkeys)}
    assert flight(tracker, b"exec") == {"exec": 0}
    assert tracker.pipelined_login is True
    assert tracker.feed("s2c", b"output") == {"stream": 0}
    assert "channel" not in tracker.turn_of
    # a lone service request (paramiko's own sequence, the fallback): the stepwise flights
    stepwise = PhaseTracker(early_channel=True)
    stepwise.feed("c2s", b"SSH-2.0-paramiko\r\n")
    stepwise.handed_to_client()
    stepwise.feed("s2c", b"SSH-2.0-OpenSSH_9\r\n")
    stepwise.feed("c2s", newkeys + b"S" * 60)
    assert flight(stepwise, b"login") == {}
    assert flight(stepwise, b"open") == {"channel": 0}
    assert flight(stepwise, b"exec") == {"exec": 0}


def test_a_refused_key_with_a_channel_open_behind_it_leaves_the_next_key_its_chance(
        box_host: Path, make_proxy: Any, tmp_path: Path) -> None:
    """sshd answers an open sent before the login's answer with UNIMPLEMENTED when the key is
    refused and keeps the connection: the next key (here ~/.ssh/id_ed25519) logs in on the
    same connection, and the command's channel is then opened the ordinary way."""
    config = yaml.safe_load(box_host.read_text())
    right = Path(config["identity_file"])
    ssh_dir = Path.home() / ".ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    (ssh_dir / "id_ed25519").write_bytes(right.read_bytes())
    (ssh_dir / "id_ed25519").chmod(0o600)
    wrong = tmp_path / "wrong_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(wrong)],
                   check=True)
    host_file, proxy = proxied(box_host, make_proxy, 0.005, identity_file=str(wrong))
    transport = run_true(host_file, tmp_path, True, early_channel=True)
    try:
        link = transport.connection.transport
        assert link.pipelined_logins == 2 and link.early_channels == 1
        assert transport.link_failures == 0
    finally:
        transport.close()
    assert proxy.accepted == 1, "the same connection"


def test_a_wrong_key_with_a_channel_open_behind_it_is_refused_as_before(
        box_host: Path, make_proxy: Any, tmp_path: Path) -> None:
    key = tmp_path / "wrong_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    host_file, proxy = proxied(box_host, make_proxy, 0.005, identity_file=str(key))
    stepwise = refusal(host_file, tmp_path, False)
    transport = SSHTransport(resolve_host(str(host_file), hosts_dir=tmp_path),
                             pipeline=True, early_channel=True)
    try:
        with pytest.raises(AuthRefused) as caught:
            transport.start(["true"])
    finally:
        transport.close()
    assert str(caught.value) == stepwise
    assert proxy.accepted == 2


def test_an_rsa_key_logs_in_with_an_sha2_signature_pipelined_or_not(tmp_path: Path) -> None:
    """paramiko picks an RSA key's signature algorithm from the server's server-sig-algs:
    the login is pipelined only once that list has arrived, and signs with rsa-sha2-* either
    way (sshd 8.8+ refuses ssh-rsa, SHA-1)."""
    from outrig.sandbox.box import start_sandbox

    box = start_sandbox(tmp_path / "rsa-box", name="rsa")
    try:
        key = tmp_path / "id_rsa"
        subprocess.run(["ssh-keygen", "-q", "-t", "rsa", "-b", "2048", "-N", "", "-f",
                        str(key)], check=True)
        authorized = box.root / "keys" / "authorized_keys"
        authorized.write_text((tmp_path / "id_rsa.pub").read_text())
        host_file = box.write_host_file(tmp_path / "hosts" / "rsa.yaml")
        config = yaml.safe_load(host_file.read_text())
        config["identity_file"] = str(key)
        host_file.write_text(yaml.safe_dump(config))
        transport = run_true(host_file, tmp_path / "hosts", True)
        try:
            link = transport.connection.transport
            assert link.is_authenticated()
            assert link._agreed_pubkey_algorithm.startswith("rsa-sha2-")
            assert link.pipelined_logins in (0, 1)
            if link.pipelined_logins:
                assert "server-sig-algs" in link.server_extensions
        finally:
            transport.close()
    finally:
        box.stop()


def test_the_tcp_connect_and_banner_leave_before_the_ssh_stack_is_built(
        box_host: Path, make_proxy: Any, tmp_path: Path) -> None:
    """The first attempt's connect and banner are sent ahead (preconnect.py); paramiko then
    takes the socket and the banner as its own: one TCP connection, the command run. The key
    exchange proves both sides saw the same line: it enters the exchange hash, which the
    server's host-key signature covers."""
    host_file, proxy = proxied(box_host, make_proxy, 0.005)
    transport = run_true(host_file, tmp_path, True)
    try:
        assert transport.early_connects == 1
        assert transport.connection.transport.local_version == CLIENT_BANNER
    finally:
        transport.close()
    assert proxy.accepted == 1


def test_no_early_connect_where_the_ssh_configuration_names_a_proxy_for_the_host(
        box_host: Path, make_proxy: Any, tmp_path: Path) -> None:
    """A proxy for another host leaves the early connect alone; one for this host (a
    ``ProxyCommand`` that fails) makes the connect fail through it, naming it, and nothing
    connects to the box directly, early or late."""
    ssh_dir = Path.home() / ".ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    (ssh_dir / "config").write_text("Host elsewhere\n  ProxyCommand false\n")
    host_file, proxy = proxied(box_host, make_proxy, 0.005)
    transport = run_true(host_file, tmp_path, True)
    try:
        assert transport.early_connects == 1
    finally:
        transport.close()
    (ssh_dir / "config").write_text("Host 127.0.0.1\n  ProxyCommand false\n")
    with pytest.raises(LinkLost, match="via the ProxyCommand in"):
        run_true(host_file, tmp_path, True, link_attempts=1)
    assert proxy.accepted == 1  # the first run's only: none direct


def test_an_early_connect_goes_where_the_configuration_sends_the_name(
        box_host: Path, make_proxy: Any, tmp_path: Path) -> None:
    """The host file says 127.0.0.2, ~/.ssh/config sends that name to 127.0.0.1 (where the
    proxy listens): the configuration is read before the early connect, which goes there."""
    host_file, proxy = proxied(box_host, make_proxy, 0.005, hostname="127.0.0.2")
    ssh_dir = Path.home() / ".ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    (ssh_dir / "config").write_text("Host 127.0.0.2\n  HostName 127.0.0.1\n")
    transport = run_true(host_file, tmp_path, True)
    try:
        assert transport.early_connects == 1 and transport.link_failures == 0
    finally:
        transport.close()
    assert proxy.accepted == 1


def test_a_cut_early_connect_is_the_first_attempts_failure_and_the_next_connects_itself(
        box_host: Path, make_proxy: Any, tmp_path: Path) -> None:
    """The proxy resets the early connection as it accepts it: the first attempt (which
    took that socket) fails as a lost link, and the second connects the ordinary way."""
    host_file, proxy = proxied(box_host, make_proxy, 0.005)
    proxy.inject(Fault(phase="tcp"))
    transport = run_true(host_file, tmp_path, True)
    try:
        assert transport.link_failures == 1 and transport.early_connects <= 1
    finally:
        transport.close()
    assert proxy.accepted == 2 and proxy.fired == [(1, "tcp", "cut")]


def test_a_paramiko_without_the_private_parts_logs_in_its_own_way_with_a_note(
        box_host: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A paramiko release that renamed a private method the pipelined login relies on costs a
    round trip, never the login: paramiko's own sequence, and one note that says why."""
    import outrig.connectors.ssh.pipelined_login as pipelined_login

    api = dict(pipelined_login.PRIVATE_API)
    api["Transport"] = (*api["Transport"], "_renamed_in_a_later_release")
    monkeypatch.setattr(pipelined_login, "PRIVATE_API", api)
    monkeypatch.setattr(pipelined_login, "_noted_fallback", False)
    pipelined_login.pipelined_transport_class.cache_clear()
    try:
        transport = run_true(box_host, tmp_path, pipeline=True)
        try:
            link = transport.connection.transport
            assert link.pipelined_logins == 0 and link.early_channels == 0
        finally:
            transport.close()
    finally:
        pipelined_login.pipelined_transport_class.cache_clear()
    err = capsys.readouterr().err
    assert err.count("Transport._renamed_in_a_later_release") == 1
    assert "paramiko's own sequence" in err
