"""``tail-logs`` end to end: the real sshd, the latency proxy cutting the link, the local mirror.

The runs here are made by hand on the sandbox box (run.json + log files under the box's
workdir): the follow op only needs a run's process names and log files, and writing the logs
from the test itself gives exact control over rotation, truncation and timing. The box is this
machine, so the test can compare the mirror with the "remote" file byte for byte.
"""

from __future__ import annotations

import io
import json
import os
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from outrig.console import Reporter
from outrig.journal import Journal
from outrig.ops.logs import tail_logs
from outrig.session import Project
from tests.support.logs import Follow, Writer, make_run, mirror_dir, wait_for

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
PROJECT = Project(REPO)


def slow_host(host_file: Path, proxy_port: int) -> Path:
    config = yaml.safe_load(host_file.read_text())
    config["port"] = proxy_port
    path = host_file.parent / "slow.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    yield Journal(tmp_path / "state")


def file_lines(path: Path) -> list[str]:
    return path.read_bytes().decode().splitlines()


def test_exactly_once_through_twenty_cuts(box_host: Path, make_proxy: Any,
                                          journal: Journal) -> None:
    logs = make_run(box_host, ["trainer", "server"])
    config = yaml.safe_load(box_host.read_text())
    proxy = make_proxy(config["port"], one_way_delay=0.005)
    host = slow_host(box_host, proxy.port)
    trainer = Writer(logs / "trainer.log", 2000, 0.004)
    server = Writer(logs / "server.log", 400, 0.02, prefix="srv")
    trainer.start()
    follow = Follow(host, journal, heartbeat=0.5, backoff=0.05)
    server.start()
    rng = random.Random(4)
    cuts = 0
    wait_for(lambda: follow.lines(), 10, "the first line")
    while cuts < 22:
        # Cut at a random moment of a live stream (cuts during the reconnect itself happen
        # too, when the random delay is short, and are retried the same way).
        wait_for(lambda: follow.tailer.call_worked, 20, "the stream to resume")
        time.sleep(rng.uniform(0.0, 0.25))
        cuts += proxy.cut_all() > 0
    trainer.join()
    server.join()
    run_dir = mirror_dir(journal, host, "job-20260101-000000-abcd")
    for name in ("trainer", "server"):
        want = (logs / f"{name}.log").read_bytes()
        wait_for(lambda n=name, w=want: (run_dir / f"{n}.log").exists()
                 and (run_dir / f"{n}.log").stat().st_size >= len(w), 30, f"{name} mirror")
    result = follow.finish()
    assert proxy.accepted > 20 and result.reconnects >= 10
    for name in ("trainer", "server"):
        remote = (logs / f"{name}.log").read_bytes()
        assert (run_dir / f"{name}.log").read_bytes() == remote, f"{name} mirror differs"
        assert follow.lines(name) == remote.decode().splitlines(), f"{name} lines differ"
    cursors = json.loads((run_dir / "cursors.json").read_text())["processes"]
    assert cursors["trainer"]["offset"] == (logs / "trainer.log").stat().st_size


def test_silent_dead_link_is_detected_from_missing_heartbeats(
        box_host: Path, make_proxy: Any, journal: Journal) -> None:
    logs = make_run(box_host, ["trainer"])
    config = yaml.safe_load(box_host.read_text())
    proxy = make_proxy(config["port"], one_way_delay=0.005)
    host = slow_host(box_host, proxy.port)
    (logs / "trainer.log").write_text("before\n")
    follow = Follow(host, journal, heartbeat=0.3, idle_limit=1.5, backoff=0.05)
    wait_for(lambda: follow.lines() == ["before"], 10, "the first line")
    proxy.set_delay(3600)  # packets now vanish (no RST): only silence tells
    blackholed = time.monotonic()
    with open(logs / "trainer.log", "a") as f:
        f.write("during\n")
    wait_for(lambda: follow.tailer.result.reconnects >= 1, 10, "the dead link to be noticed")
    detected = time.monotonic() - blackholed
    proxy.set_delay(0.005)
    proxy.cut_all()  # drop the old connection whose bytes are parked for an hour
    wait_for(lambda: follow.lines() == ["before", "during"], 20, "the resumed stream")
    follow.finish()
    assert detected < 4.0, f"dead link noticed after {detected:.1f}s"


def test_rotation_and_truncation_mid_follow(box_host: Path, journal: Journal) -> None:
    logs = make_run(box_host, ["rot", "trunc"])
    rot, trunc = logs / "rot.log", logs / "trunc.log"
    rot.write_text("r1\nr2\n")
    trunc.write_text("t1\nt2\nt3\n")
    follow = Follow(box_host, journal, heartbeat=0.5)
    wait_for(lambda: len(follow.lines()) == 5, 10, "the first lines")
    rot.rename(logs / "rot.log.1")  # logrotate: rename, then the writer reopens the path
    rot.write_text("r3\n")
    with open(trunc, "r+") as f:  # copytruncate: same file, cut to zero, written again
        f.truncate(0)
    time.sleep(0.5)
    with open(trunc, "a") as f:
        f.write("t4\n")
    wait_for(lambda: follow.lines("rot") == ["r1", "r2", "r3"]
             and follow.lines("trunc") == ["t1", "t2", "t3", "t4"], 10, "rotated lines")
    follow.finish()
    run_dir = mirror_dir(journal, box_host, "job-20260101-000000-abcd")
    assert (run_dir / "rot.log.1").read_text() == "r1\nr2\n"
    assert (run_dir / "rot.log").read_text() == "r3\n"
    assert (run_dir / "trunc.log.1").read_text() == "t1\nt2\nt3\n"
    assert (run_dir / "trunc.log").read_text() == "t4\n"


def test_missing_log_is_waited_for_and_empty_log_is_fine(box_host: Path,
                                                         journal: Journal) -> None:
    logs = make_run(box_host, ["late", "quiet"])
    (logs / "quiet.log").write_bytes(b"")
    follow = Follow(box_host, journal, heartbeat=0.5)
    time.sleep(0.8)
    (logs / "late.log").write_text("hello\nworld\n")
    wait_for(lambda: follow.lines("late") == ["hello", "world"], 10, "the late log")
    result = follow.finish()
    assert follow.lines("quiet") == []
    assert result.opens["quiet"]["size"] == 0

    # --no-follow on the same run returns at once, with nothing new to say.
    out = io.StringIO()
    started = time.monotonic()
    again = tail_logs(PROJECT, str(box_host), Reporter(json_mode=True, out=out,
                                                       err=io.StringIO()),
                      follow=False, journal=journal)
    assert time.monotonic() - started < 10
    assert out.getvalue() == "" and again.bytes == 0


def test_restart_resumes_from_the_journal_cursor(box_host: Path, journal: Journal) -> None:
    logs = make_run(box_host, ["trainer"])
    log = logs / "trainer.log"
    log.write_text("a\nb\npartial")
    first = io.StringIO()
    tail_logs(PROJECT, str(box_host), Reporter(json_mode=True, out=first, err=io.StringIO()),
              follow=False, journal=journal)
    assert [json.loads(x)["line"] for x in first.getvalue().splitlines()] == ["a", "b", "partial"]
    with open(log, "a") as f:
        f.write(" line\nc\n")
    second = io.StringIO()
    tail_logs(PROJECT, str(box_host), Reporter(json_mode=True, out=second, err=io.StringIO()),
              follow=False, journal=journal)
    # The unterminated line continues from the mirror: shown whole once it ends.
    assert [json.loads(x)["line"] for x in second.getvalue().splitlines()] == [
        "partial line", "c"]
    run_dir = mirror_dir(journal, box_host, "job-20260101-000000-abcd")
    assert (run_dir / "trainer.log").read_bytes() == log.read_bytes()


def test_lines_on_a_huge_file_seeks_from_the_end(box_host: Path, journal: Journal) -> None:
    logs = make_run(box_host, ["big"])
    big = logs / "big.log"
    with open(big, "wb") as f:
        f.truncate(2 << 30)  # 2 GiB of hole: reading it would take far longer than allowed
        f.seek(0, os.SEEK_END)
        f.write(b"".join(f"tail {i}\n".encode() for i in range(1000)))
    out = io.StringIO()
    started = time.monotonic()
    result = tail_logs(PROJECT, str(box_host),
                       Reporter(json_mode=True, out=out, err=io.StringIO()),
                       lines=100, follow=False, processes=["big"], journal=journal)
    elapsed = time.monotonic() - started
    lines = [json.loads(x)["line"] for x in out.getvalue().splitlines()]
    assert lines == [f"tail {i}" for i in range(900, 1000)]
    assert result.opens["big"]["scanned"] < 256 * 1024, "must read only the end of the file"
    assert result.bytes == sum(len(f"tail {i}\n") for i in range(900, 1000))
    assert elapsed < 10
    # a head over 64 MiB is not fetched: the mirror records the gap, and says so when shown
    cursors = json.loads((mirror_dir(journal, box_host, "job-20260101-000000-abcd")
                          / "cursors.json").read_text())
    opened = result.opens["big"]
    assert opened["offset"] > 2 << 30 and opened["reason"] == "lines"
    assert cursors["gaps"]["big"] == [{"inode": opened["inode"], "from": 0,
                                       "to": opened["offset"]}]


def test_a_lines_first_fetch_still_mirrors_every_line(box_host: Path, make_proxy: Any,
                                                      journal: Journal) -> None:
    """The first tail-logs of a run is `--lines 3` (the demo's): 3 lines are shown, but the
    mirror gets the log from byte 0, so a later read of the mirror (tail-logs on a dead box,
    metrics) has every line; the next tail-logs resumes after the cursor."""
    logs = make_run(box_host, ["trainer"])
    text = "".join(f"global_step={i} loss={1 / (i + 1):.4f}\n" for i in range(500))
    (logs / "trainer.log").write_text(text)
    proxy = make_proxy(yaml.safe_load(box_host.read_text())["port"], one_way_delay=0.12)
    host = slow_host(box_host, proxy.port)
    out = io.StringIO()
    tail_logs(PROJECT, str(host), Reporter(json_mode=True, out=out, err=io.StringIO()),
              lines=3, follow=False, journal=journal)
    shown = [json.loads(x)["line"] for x in out.getvalue().splitlines()]
    assert shown == [f"global_step={i} loss={1 / (i + 1):.4f}" for i in (497, 498, 499)]
    run_dir = mirror_dir(journal, host, "job-20260101-000000-abcd")
    assert (run_dir / "trainer.log").read_text() == text, "the mirror holds every line"
    assert "gaps" not in json.loads((run_dir / "cursors.json").read_text())
    with open(logs / "trainer.log", "a") as f:
        f.write("global_step=500 loss=0.0020\n")
    after = io.StringIO()
    tail_logs(PROJECT, str(host), Reporter(json_mode=True, out=after, err=io.StringIO()),
              follow=False, journal=journal)
    assert [json.loads(x)["line"] for x in after.getvalue().splitlines()] == \
        ["global_step=500 loss=0.0020"]
    assert (run_dir / "trainer.log").read_text() == text + "global_step=500 loss=0.0020\n"


def test_grep_and_unknown_process(box_host: Path, journal: Journal) -> None:
    from outrig.errors import ConfigError, RemoteError

    logs = make_run(box_host, ["trainer"])
    (logs / "trainer.log").write_text("loss=1\nnoise\nloss=2\n")
    out = io.StringIO()
    tail_logs(PROJECT, str(box_host), Reporter(json_mode=True, out=out, err=io.StringIO()),
              follow=False, grep=r"^loss=", journal=journal)
    assert [json.loads(x)["line"] for x in out.getvalue().splitlines()] == ["loss=1", "loss=2"]
    run_dir = mirror_dir(journal, box_host, "job-20260101-000000-abcd")
    assert (run_dir / "trainer.log").read_text() == "loss=1\nnoise\nloss=2\n"  # mirror: all
    with pytest.raises(RemoteError, match="no process nope"):
        tail_logs(PROJECT, str(box_host), Reporter(quiet=True), follow=False,
                  processes=["nope"], journal=journal)
    with pytest.raises(ConfigError, match="--grep"):
        tail_logs(PROJECT, str(box_host), Reporter(quiet=True), grep="(", journal=journal)


def test_nothing_new_says_so_and_how_to_see_older_lines(box_host: Path,
                                                        journal: Journal) -> None:
    logs = make_run(box_host, ["trainer"])
    (logs / "trainer.log").write_text("a\nb\n")
    tail_logs(PROJECT, str(box_host), Reporter(quiet=True, out=io.StringIO()),
              follow=False, journal=journal)
    run_dir = mirror_dir(journal, box_host, "job-20260101-000000-abcd")

    # --no-follow: one line on stderr, nothing on stdout (the JSON stream stays clean).
    out, err = io.StringIO(), io.StringIO()
    again = tail_logs(PROJECT, str(box_host), Reporter(json_mode=True, out=out, err=err),
                      follow=False, journal=journal)
    assert out.getvalue() == "" and again.lines == 0
    note = " ".join(err.getvalue().split())  # the console may wrap the line
    assert "nothing new" in note and "--lines" in note and str(run_dir) in note
    # ... and the advice works: --lines shows the older lines again.
    older = io.StringIO()
    tail_logs(PROJECT, str(box_host), Reporter(json_mode=True, out=older, err=io.StringIO()),
              lines=10, follow=False, journal=journal)
    assert [json.loads(x)["line"] for x in older.getvalue().splitlines()] == ["a", "b"]

    # follow: said once, when the first heartbeat shows the logs are idle; new lines still come.
    follow = Follow(box_host, journal, heartbeat=0.3)
    err_stream = follow.session.reporter.console.file
    wait_for(lambda: "nothing new" in err_stream.getvalue(), 10, "the nothing-new note")
    with open(logs / "trainer.log", "a") as f:
        f.write("c\n")
    wait_for(lambda: follow.lines() == ["c"], 10, "the new line")
    follow.finish()
    assert err_stream.getvalue().count("nothing new") == 1
