"""The ``on_event`` hook (outrig/watching/notify.py): a real local command gets each event as
JSON."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest

from outrig.cli.settings import Settings
from outrig.errors import ConfigError
from outrig.session import Project
from outrig.watching.notify import Notifier, hook_argv
from tests.support.processes import wait_gone


def _recorder(tmp_path: Path) -> tuple[list[str], Path]:
    out = tmp_path / "events.jsonl"
    code = ("import json,os,sys; d=json.load(sys.stdin); d['env']=os.environ['OUTRIG_EVENT'];"
            f"open({str(out)!r},'a').write(json.dumps(d)+'\\n')")
    return [sys.executable, "-c", code], out


def test_events_reach_the_hook_in_order_with_their_name(tmp_path: Path) -> None:
    argv, out = _recorder(tmp_path)
    notifier = Notifier(argv)
    notifier.send("suspect", host="a", why="no heartbeat for 9s")
    notifier.send("dead", host="a")
    notifier.send("migrating", host="a", to="b")
    notifier.close(timeout=60)
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert [g["event"] for g in got] == ["suspect", "dead", "migrating"]
    assert [g["env"] for g in got] == ["suspect", "dead", "migrating"]
    assert got[0]["why"] == "no heartbeat for 9s" and got[2]["to"] == "b"
    assert notifier.failures == []


def test_no_hook_sends_nothing_but_remembers(tmp_path: Path) -> None:
    notifier = Notifier(None)
    notifier.send("finished", host="a")
    notifier.close(timeout=5)
    assert [e["event"] for e in notifier.sent] == ["finished"]
    assert notifier._thread is None


def test_failing_missing_and_hanging_hooks_are_warnings(tmp_path: Path) -> None:
    failing = Notifier([sys.executable, "-c", "import sys; sys.stderr.write('bad url\\n'); "
                        "sys.exit(3)"])
    failing.send("failed", host="a")
    failing.close(timeout=60)
    assert failing.failures and "exited 3" in failing.failures[0]
    assert "bad url" in failing.failures[0]
    missing = Notifier([str(tmp_path / "no-such-hook")])
    missing.send("dead", host="a")
    missing.close(timeout=60)
    assert missing.failures and "could not start" in missing.failures[0]
    hanging = Notifier([sys.executable, "-c", "import time; time.sleep(600)"], timeout=1)
    hanging.send("dead", host="a")
    hanging.close(timeout=60)
    assert hanging.failures and "was stopped" in hanging.failures[0]


def test_unknown_event_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="unknown event"):
        Notifier(None).send("exploded")


def test_hook_argv_forms() -> None:
    assert hook_argv("curl -s -d @- 'https://h/x y'", "f") == ["curl", "-s", "-d", "@-",
                                                               "https://h/x y"]
    assert hook_argv(["notify", 3], "f") == ["notify", "3"]
    assert hook_argv(None, "f") is None and hook_argv("", "f") is None
    with pytest.raises(ConfigError, match="f: on_event: cannot split"):
        hook_argv("curl 'unclosed", "f")
    with pytest.raises(ConfigError, match="on_event: must be a command"):
        hook_argv({"url": "x"}, "f")


def test_settings_on_event_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OUTRIG_ON_EVENT", raising=False)
    settings = Settings(Project(tmp_path), "test")
    assert settings.on_event() is None
    (tmp_path / "outrig.yaml").write_text("on_event: ./hook.sh --loud\n")
    assert settings.on_event() == ["./hook.sh", "--loud"]
    monkeypatch.setenv("OUTRIG_ON_EVENT", "other")
    assert settings.on_event() == ["other"]
    monkeypatch.delenv("OUTRIG_ON_EVENT")
    (tmp_path / "outrig.yaml").write_text("on_event: {url: x}\n")
    with pytest.raises(ConfigError, match="outrig.yaml: on_event"):
        settings.on_event()


LEAVER = """
import json, os, subprocess, sys
event = json.load(sys.stdin)
open(sys.argv[1], "a").write(event["event"] + "\\n")
if event["event"] in ("dead", "migrating"):
    # a process left running with the hook's stderr: in a process group of its own (same
    # session) for "dead", in a session of its own (a daemon) for "migrating"
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"], stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL, process_group=0 if event["event"] == "dead" else None,
        start_new_session=event["event"] == "migrating")
    ticks = open(f"/proc/{child.pid}/stat").read().rsplit(")", 1)[1].split()[19]
    open(sys.argv[2], "a").write(f"{event['event']} {child.pid} {ticks}\\n")
"""


def _start_ticks(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return None
    return None if fields[0] == "Z" else fields[19]


def test_a_hook_that_leaves_a_process_holding_its_output_is_stopped_and_later_events_arrive(
        tmp_path: Path) -> None:
    events, left = tmp_path / "events.txt", tmp_path / "left.txt"
    notifier = Notifier([sys.executable, "-c", LEAVER, str(events), str(left)],
                        timeout=1, grace=0.5)
    for event in ("dead", "migrating", "resumed"):
        notifier.send(event, host="a")
    thread = notifier._thread
    try:
        notifier.close(timeout=30)
        assert thread is not None and not thread.is_alive(), "the hook's pipes held the watch"
        assert events.read_text().split() == ["dead", "migrating", "resumed"]
        assert len(notifier.failures) == 2, notifier.failures
        assert all("was stopped" in f and "the next events are still sent" in f
                   for f in notifier.failures)
        assert "exited 0, but what it left running held its output open" \
            in notifier.failures[0]
        assert "outside its session still holds its output" in notifier.failures[1]
        records = dict((e, (int(p), t)) for e, p, t in
                       (line.split() for line in left.read_text().splitlines()))
        in_session = records["dead"][0]
        assert wait_gone([in_session]) == [], "the process left in the hook's session runs on"
    finally:  # the daemon that left the session is not the hook's to kill: the test's
        for line in left.read_text().splitlines() if left.exists() else []:
            _, pid, ticks = line.split()
            if _start_ticks(int(pid)) == ticks:
                os.kill(int(pid), signal.SIGKILL)
