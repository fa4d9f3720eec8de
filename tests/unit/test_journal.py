"""The journal's rules (outrig/journal.py): private, never a traceback for a damaged record,
read-merge-write under a lock (tested with two real processes), a failed write named."""

from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from outrig.errors import LocalWriteError
from outrig.journal import Journal, journal_write_failed, private_state_dir
from outrig.logs.mirror import MirrorStore
from outrig.logs.tail import Cursor


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


# ------------------------------------------------------------------ unreadable records


def damaged_journal(root: Path) -> dict[str, Path]:
    """A journal with one good run and three records that cannot be read."""
    journal = Journal(root)
    journal.record_run("good", {"run_id": "good", "host": "h", "playbook": "p",
                                "status": "running", "created": 1.0})
    bad = {"utf8": root / "runs" / "utf8.json", "folder": root / "runs" / "x.json",
           "host": root / "hosts" / "h.json"}
    bad["utf8"].write_bytes(b'{"run_id": "utf8", "host": "h", "note": "\xff\xfe"}')
    bad["folder"].mkdir()
    bad["host"].parent.mkdir(parents=True, exist_ok=True)
    bad["host"].write_bytes(b"\xc3\x28 not json either")
    return bad


def test_unreadable_records_are_skipped_with_a_warning_naming_them_and_moved_aside(
        tmp_path: Path) -> None:
    root = tmp_path / "state"
    bad = damaged_journal(root)
    notes: list[str] = []
    journal = Journal(root, notify=notes.append)
    assert [r["run_id"] for r in journal.runs(host="h")] == ["good"]
    assert journal.host_facts("h") == {}
    assert journal.run("utf8") is None
    for path in bad.values():
        assert not path.exists(), f"{path} was not moved aside"
        assert len(list(path.parent.glob(f"{path.name}.unreadable-*"))) == 1
        assert sum(str(path) in note for note in notes) == 1, notes
    assert all(note.startswith("warning: skipped the unreadable journal record")
               for note in notes)
    again: list[str] = []
    Journal(root, notify=again.append).runs()
    assert again == [], "a record moved aside is not warned about twice"
    journal.update_host("h", rtt=0.1)  # a new record takes the damaged one's place
    assert journal.host_facts("h")["rtt"] == 0.1


def test_a_record_that_is_not_an_object_is_unreadable_too(tmp_path: Path) -> None:
    notes: list[str] = []
    journal = Journal(tmp_path / "state", notify=notes.append)
    path = journal.run_path("list")
    path.parent.mkdir(parents=True)
    path.write_text("[1, 2]")
    assert journal.run("list") is None
    assert "a JSON list, not an object" in notes[0]


# ------------------------------------------------------------------ private state


def test_a_new_state_root_is_private_and_so_is_everything_written_in_it(tmp_path: Path) -> None:
    root = tmp_path / "fresh" / "outrig"
    journal = Journal(root)
    assert mode(root) == 0o700
    journal.record_run("r", {"run_id": "r"})
    journal.update_host("h", rtt=0.2)
    for path in (root / "runs", root / "hosts"):
        assert mode(path) == 0o700
    assert {mode(p) for p in root.rglob("*") if p.is_file()} == {0o600}
    store = MirrorStore(root / "logs" / "h" / "r")
    store.append("server", b"a line a process printed\n")
    store.commit("h", "r", {"server": Cursor(1, 25)})
    store.close()
    assert mode(root / "logs") == mode(root / "logs" / "h" / "r") == 0o700
    assert mode(store.path("server")) == mode(store.cursor_file) == 0o600


def test_an_open_state_root_is_tightened_on_first_use_with_a_note(tmp_path: Path) -> None:
    root = tmp_path / "old" / "outrig"
    (root / "logs" / "h" / "r").mkdir(parents=True)
    for folder in (root, root / "logs", root / "logs" / "h", root / "logs" / "h" / "r"):
        folder.chmod(0o755)
    mirror = root / "logs" / "h" / "r" / "server.log"
    mirror.write_text("what a process printed\n")
    mirror.chmod(0o644)
    notes: list[str] = []
    private_state_dir(root, notes.append)
    assert mode(root) == mode(root / "logs") == mode(root / "logs" / "h" / "r") == 0o700
    assert mode(mirror) == 0o600
    assert len(notes) == 1 and notes[0].startswith(f"note: made {root} private (mode 755")
    assert "4 folder(s) and file(s)" in notes[0]
    private_state_dir(root, notes.append)
    Journal(root, notify=notes.append)
    assert len(notes) == 1, "the note is given once"


# ------------------------------------------------------------------ lost updates


WRITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from outrig.journal import Journal

    root, name, go = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    journal = Journal(root)
    while not go.exists():
        time.sleep(0.001)
    for i in range(150):
        journal.record_run("shared", {f"{name}-{i}": i})
        journal.update_host("shared-host", **{f"{name}-{i}": i})
""")


def test_two_processes_updating_one_record_lose_no_key(tmp_path: Path) -> None:
    root, go = tmp_path / "state", tmp_path / "go"
    Journal(root)
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(root), name, str(go)])
               for name in ("a", "b")]
    go.touch()  # both start at the same moment
    assert [w.wait(timeout=300) for w in writers] == [0, 0]
    journal = Journal(root)
    for record in (journal.run("shared") or {}, journal.host_facts("shared-host")):
        keys = {k for k in record if k[0] in "ab" and "-" in k}
        assert len(keys) == 300, f"{300 - len(keys)} of 300 keys lost"


# ------------------------------------------------------------------ failed writes


def test_a_journal_write_on_a_full_disk_names_the_file_and_the_fix(tmp_path: Path) -> None:
    full = journal_write_failed(tmp_path / "runs" / "r.json",
                                OSError(errno.ENOSPC, "No space left on device"))
    text = str(full)
    assert isinstance(full, LocalWriteError)
    assert "this workstation's disk is full or read-only" in text
    assert str(tmp_path / "runs" / "r.json") in text and "No space left on device" in text
    assert "XDG_STATE_HOME" in text and "not the box" in text
    root = tmp_path / "state"
    journal = Journal(root)
    (root / "runs").write_text("a file where the folder should be")
    with pytest.raises(LocalWriteError, match="cannot write its journal"):
        journal.record_run("r", {"run_id": "r"})
    assert json.loads(json.dumps({"ok": 1}))  # the module's JSON helpers stay importable
