"""Files and working folders stay inside the workdir on the box (remote/agent/, run locally).

``files:`` paths are relative without '..' (checked at plan time too), but a folder on the box
may be a symlink leading out of the workdir: writing through it must be refused before any
file is written. A relative ``cwd`` must not leave the workdir either, by '..' or by a link.
"""

from __future__ import annotations

import base64
import os

from tests.support.agent import R1, Box, error_of, names, sleeper


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_files_through_a_symlinked_folder_are_refused_and_nothing_is_written(box: Box) -> None:
    outside = box.tmp / "outside"
    outside.mkdir()
    box.workdir.mkdir()
    os.symlink(outside, box.workdir / "conf")
    files = [{"path": "fine.txt", "data_b64": b64(b"ok")},
             {"path": "conf/evil.txt", "data_b64": b64(b"escaped")}]
    events, result = box.deploy([sleeper("a")], files=files)
    err = error_of(result, "workdir")
    assert "conf" in err["message"] and "symlink" in err["message"]
    assert list(outside.iterdir()) == []
    assert not (box.workdir / "fine.txt").exists()  # refused before anything was written
    assert not names(events, "launched")


def test_files_through_a_deeper_symlink_are_refused(box: Box) -> None:
    outside = box.tmp / "outside"
    outside.mkdir()
    (box.workdir / "a").mkdir(parents=True)
    os.symlink(outside, box.workdir / "a" / "b")
    _, result = box.deploy([sleeper("a")],
                           files=[{"path": "a/b/c/evil.txt", "data_b64": b64(b"x")}])
    assert "a/b" in error_of(result, "workdir")["message"]
    assert list(outside.iterdir()) == []


def test_file_replacing_a_symlink_does_not_write_through_it(box: Box) -> None:
    outside = box.tmp / "target.txt"
    outside.write_text("theirs")
    box.workdir.mkdir()
    os.symlink(outside, box.workdir / "x.txt")
    _, result = box.deploy([sleeper("a")], files=[{"path": "x.txt", "data_b64": b64(b"ours")}])
    assert result["ok"] is True, result
    assert outside.read_text() == "theirs"
    assert not (box.workdir / "x.txt").is_symlink()
    assert (box.workdir / "x.txt").read_text() == "ours"


def test_cwd_with_dotdot_is_a_bad_request(box: Box) -> None:
    events, result = box.deploy([sleeper("a", cwd="../../tmp")])
    assert "leaves the workdir" in error_of(result, "bad_request")["message"]
    assert not names(events, "launched")
    assert not (box.workdir / "runs" / R1).exists()


def test_cwd_through_a_symlink_out_of_the_workdir_is_refused(box: Box) -> None:
    outside = box.tmp / "elsewhere"
    outside.mkdir()
    box.workdir.mkdir()
    os.symlink(outside, box.workdir / "jobdir")
    events, result = box.deploy([sleeper("a", cwd="jobdir")])
    err = error_of(result, "workdir")
    assert "outside the workdir" in err["message"] and err["process"] == "a"
    assert not names(events, "launched")
