"""Link faults aimed at each SSH phase (the latency proxy's fault injector), and how outrig
reports them: a cut or a silence is a lost link, retried a bounded number of times; only the
box's refusal of every key is "authentication failed", and it is never retried."""

from __future__ import annotations

import contextlib
import errno
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from outrig.connectors.ssh.transport import SSHTransport
from outrig.console import Reporter
from outrig.errors import AuthRefused, LinkLost, LocalWriteError
from outrig.inventory import resolve_host
from outrig.journal import Journal
from outrig.ops.status import status
from outrig.sandbox.proxy import Fault, LatencyProxy
from outrig.session import Project
from outrig.timing import channel_timeout_for
from outrig.transport import CHANNEL_ATTEMPTS, LINK_ATTEMPTS, SILENT_ATTEMPTS
from tests.support.logs import Follow, Writer, make_run, mirror_dir, wait_for

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
PROJECT = Project(REPO)


@pytest.fixture
def journal(tmp_path: Path) -> Journal:
    return Journal(tmp_path / "state")


def proxied(box_host: Path, make_proxy: Any, **changes: Any) -> tuple[Path, LatencyProxy]:
    """A host file for the sandbox through a fresh fault-injecting proxy."""
    config = yaml.safe_load(box_host.read_text())
    proxy: LatencyProxy = make_proxy(config["port"], one_way_delay=0.005)
    config["port"] = proxy.port
    config.update(changes)
    path = box_host.parent / "faulty.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, proxy


def test_cut_during_auth_is_a_lost_link_and_is_retried(box_host: Path, make_proxy: Any,
                                                        journal: Journal) -> None:
    host, proxy = proxied(box_host, make_proxy)
    proxy.inject(Fault(phase="auth"), Fault(phase="auth"))
    result = status(PROJECT, str(host), Reporter(quiet=True), journal=journal)
    assert result["ok"] is True
    assert proxy.fired == [(1, "auth", "cut"), (2, "auth", "cut")]
    assert proxy.accepted == 3


def test_the_retry_notice_says_what_happened_to_the_link(box_host: Path,
                                                         make_proxy: Any) -> None:
    """It read "the link to X; retrying in 0.2 s": cut at the first parenthesis, which came
    right after the host's name, so the verb was lost (issue 40)."""
    host, proxy = proxied(box_host, make_proxy)
    proxy.inject(Fault(phase="auth"), Fault(phase="channel"))
    notices: list[str] = []
    transport = SSHTransport(resolve_host(str(host), hosts_dir=box_host.parent),
                             notify=notices.append)
    try:
        assert transport.start(["true"]).exit_status(30) == 0
    finally:
        transport.close()
    retries = [n for n in notices if "retrying in" in n]  # not the new host key's line
    assert len(retries) == 2, notices
    assert retries[0].startswith("the link to faulty dropped during authentication"), retries
    assert retries[1].startswith("faulty: the link dropped just after authentication, while "
                                 "opening a session channel; retrying in"), retries


def test_cuts_at_every_handshake_attempt_end_as_a_lost_link_not_auth_failure(
        box_host: Path, make_proxy: Any, journal: Journal) -> None:
    host, proxy = proxied(box_host, make_proxy)
    proxy.inject(*[Fault(phase="auth") for _ in range(LINK_ATTEMPTS + 2)])
    with pytest.raises(LinkLost) as caught:
        status(PROJECT, str(host), Reporter(quiet=True), journal=journal)
    assert not isinstance(caught.value, AuthRefused)
    assert caught.value.phase == "auth"
    assert "authentication failed" not in str(caught.value)
    assert "dropped during authentication" in str(caught.value)
    assert proxy.accepted == LINK_ATTEMPTS, "retries must be bounded"


def test_refused_key_is_auth_failure_and_never_retried(box_host: Path, make_proxy: Any,
                                                      tmp_path: Path, journal: Journal) -> None:
    wrong_key = tmp_path / "wrong_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(wrong_key)],
                   check=True)
    host, proxy = proxied(box_host, make_proxy, identity_file=str(wrong_key))
    with pytest.raises(AuthRefused, match="authentication failed .* tried .*wrong_key"):
        status(PROJECT, str(host), Reporter(quiet=True), journal=journal)
    assert proxy.accepted == 1


def start_fails(host_file: Path, tmp_path: Path) -> LinkLost:
    """The LinkLost that starting a command through ``host_file`` ends in."""
    transport = SSHTransport(resolve_host(str(host_file), hosts_dir=tmp_path))
    try:
        with pytest.raises(LinkLost) as caught:
            transport.start(["true"])
    finally:
        transport.close()
    return caught.value


def test_cut_just_after_auth_names_what_happened(box_host: Path, make_proxy: Any,
                                                tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # the open waits for the login's answer: the only layout with a moment between the two
    monkeypatch.setenv("OUTRIG_SSH_PIPELINE", "login")
    host_file, proxy = proxied(box_host, make_proxy)
    proxy.inject(*[Fault(phase="channel") for _ in range(CHANNEL_ATTEMPTS + 2)])
    lost = start_fails(host_file, tmp_path)
    text = str(lost)
    assert lost.phase == "channel" and not lost.request_sent
    assert "dropped just after authentication" in text
    assert "channel: " not in text and "()" not in text, text
    assert [f[1] for f in proxy.fired] == ["channel"] * CHANNEL_ATTEMPTS  # bounded


def test_silence_just_after_auth_says_the_link_went_silent(
        box_host: Path, make_proxy: Any, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OUTRIG_SSH_PIPELINE", "login")  # as in the test above
    # connect_timeout: also the channel-open limit; generous enough for a loaded machine's
    # handshake, short enough for a test.
    host_file, proxy = proxied(box_host, make_proxy, connect_timeout=4)
    proxy.inject(*[Fault(phase="channel", action="blackhole")
                   for _ in range(CHANNEL_ATTEMPTS + 2)])
    text = str(start_fails(host_file, tmp_path))
    assert "went silent after authentication" in text and "within 4 s" in text
    assert "Timeout opening channel" not in text
    # each silence costs a whole limit, so fewer of them are tried than of quick cuts
    assert [f[1:] for f in proxy.fired] == [("channel", "blackhole")] * SILENT_ATTEMPTS


def test_channel_open_limit_scales_with_the_measured_rtt(box_host: Path,
                                                        tmp_path: Path) -> None:
    host = resolve_host(str(box_host), hosts_dir=tmp_path)
    assert channel_timeout_for(host, 0.002)[0] == 5.0  # a floor for a loaded sshd
    limit, why = channel_timeout_for(host, 1.5)
    assert limit == 30.0 and "1500 ms" in why


def test_follow_survives_a_cut_at_every_phase_before_its_first_event(
        box_host: Path, make_proxy: Any, journal: Journal) -> None:
    logs = make_run(box_host, ["trainer"])
    host, proxy = proxied(box_host, make_proxy)
    phases = ["tcp", "banner", "kex", "auth", "channel", "exec", "stream",
              "auth", "kex", "channel"]  # the second round: cuts during reconnects' handshakes
    proxy.inject(*[Fault(phase=p) for p in phases])
    writer = Writer(logs / "trainer.log", 300, 0.003)
    writer.start()
    follow = Follow(host, journal, heartbeat=0.5, backoff=0.05)
    writer.join()
    want = (logs / "trainer.log").read_bytes()
    wait_for(lambda: follow.lines() == want.decode().splitlines(), 60, "every line once")
    result = follow.finish()
    assert [f[1] for f in proxy.fired] == phases
    assert result.reconnects >= 1
    run_dir = mirror_dir(journal, host, "job-20260101-000000-abcd")
    assert (run_dir / "trainer.log").read_bytes() == want


def test_give_up_message_names_the_measured_rtt(box_host: Path, make_proxy: Any,
                                                journal: Journal) -> None:
    logs = make_run(box_host, ["trainer"])
    (logs / "trainer.log").write_text("one\n")
    host, proxy = proxied(box_host, make_proxy)
    follow = Follow(host, journal, heartbeat=0.3, backoff=0.05, give_up_after=1.0)
    wait_for(lambda: follow.lines() == ["one"], 20, "the first line")
    proxy.inject(*[Fault(phase="tcp", action="cut") for _ in range(1000)])
    proxy.cut_all()
    follow.thread.join(60)
    assert not follow.thread.is_alive()
    error = follow.error
    assert error is not None and "gave up" in str(error)
    assert "no RTT measured yet" not in str(error)
    assert "measured RTT" in str(error)


@contextlib.contextmanager
def full_filesystem(path: Path) -> Iterator[Path]:
    """A tiny tmpfs mounted at ``path`` and filled to the last byte (skip where this machine
    does not let us mount one: not root, or no CAP_SYS_ADMIN in a container)."""
    path.mkdir(parents=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(path)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs to fill ({mounted.stderr.strip()})")
    try:
        with open(path / "filler", "wb", buffering=0) as filler:
            try:
                while True:
                    filler.write(b"\0" * 4096)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_full_workstation_disk_stops_tail_logs_with_the_path(box_host: Path,
                                                             journal: Journal) -> None:
    logs = make_run(box_host, ["trainer"])
    (logs / "trainer.log").write_text("a line\n")
    with full_filesystem(journal.root / "logs"):
        follow = Follow(box_host, journal, heartbeat=0.3, backoff=0.05, give_up_after=30)
        wait_for(lambda: "trainer" in follow.tailer.result.opens, 20, "the log to be opened")
        with open(logs / "trainer.log", "a") as log:
            log.write("one more line\n" * 2000)
        follow.thread.join(60)
        assert not follow.thread.is_alive()
    assert isinstance(follow.error, LocalWriteError), follow.error
    text = str(follow.error)
    assert str(journal.root / "logs") in text and "free space" in text
    assert follow.tailer.result.reconnects == 0


def test_full_workstation_disk_under_the_journal_is_one_paragraph_and_keeps_the_cursor(
        box_host: Path, small_fs: Path) -> None:
    """The whole state folder on a disk that fills up: tail-logs (whose journal note of the
    RTT comes after the mirror failed) and status (whose journal follows the box) end with
    the paragraph that names the file and the fix, not an ENOSPC traceback; the cursor
    saved before stays, and once there is room tail-logs resumes without losing or
    repeating a line."""
    from outrig.ops.logs import tail_logs
    from outrig.sandbox.fulldisk import fill

    logs = make_run(box_host, ["trainer"])
    (logs / "trainer.log").write_text("".join(f"line {i}\n" for i in range(5)))
    journal = Journal(small_fs / "outrig")
    first = tail_logs(PROJECT, str(box_host), Reporter(quiet=True), follow=False,
                      journal=journal)
    assert first.lines == 5 and first.mirror_dir is not None
    cursors = (first.mirror_dir / "cursors.json").read_bytes()
    with open(logs / "trainer.log", "a") as log:
        log.write("".join(f"line {i}\n" for i in range(5, 4005)))
    fill(small_fs)
    for command in ("tail-logs", "status"):
        with pytest.raises(LocalWriteError) as caught:
            if command == "tail-logs":
                tail_logs(PROJECT, str(box_host), Reporter(quiet=True), follow=False,
                          journal=journal)
            else:
                status(PROJECT, str(box_host), Reporter(quiet=True), journal=journal)
        text = str(caught.value)
        assert str(small_fs) in text and "No space left on device" in text, text
        assert "free space there" in text and "XDG_STATE_HOME" in text, text
    assert (first.mirror_dir / "cursors.json").read_bytes() == cursors, "the cursor stays"
    (small_fs / "filler.bin").unlink()
    second = tail_logs(PROJECT, str(box_host), Reporter(quiet=True), follow=False,
                       journal=journal)
    assert second.lines == 4000
    assert (first.mirror_dir / "trainer.log").read_bytes() == (logs / "trainer.log").read_bytes()


def test_unwritable_mirror_stops_tail_logs_instead_of_reconnecting(box_host: Path,
                                                                  journal: Journal) -> None:
    # Runs everywhere (no mount needed): the mirror's folder cannot be made, an OSError like
    # ENOSPC, raised by the same local writes.
    logs = make_run(box_host, ["trainer"])
    (logs / "trainer.log").write_text("a line\n")
    journal.root.mkdir(parents=True, exist_ok=True)
    (journal.root / "logs").write_text("a file where the mirror folder should be\n")
    follow = Follow(box_host, journal, heartbeat=0.3, backoff=0.05, give_up_after=30)
    wait_for(lambda: "trainer" in follow.tailer.result.opens or not follow.thread.is_alive(),
             20, "the log to be opened")
    with open(logs / "trainer.log", "a") as log:
        log.write("one more line\n")
    follow.thread.join(60)
    assert not follow.thread.is_alive()
    assert isinstance(follow.error, LocalWriteError), follow.error
    assert str(journal.root / "logs") in str(follow.error)
    assert follow.tailer.result.reconnects == 0
