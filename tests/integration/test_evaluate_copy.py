"""``evaluate.during_training.host``: a checkpoint of the training box copied onto the second
box for its evaluation, on two sandbox boxes (A with its own sshd, B on the session's), each
a real sshd and the real agent. The copy is judged complete by the agent's own rule there and
names the state it copied; when the training box rewrites the folder (a later mid-epoch save)
the next copy brings the new state, moving only the files that changed."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from outrig.checkpoints import assess
from outrig.console import Reporter
from outrig.inventory import HostBook
from outrig.journal import Journal
from outrig.ops.evaluate_copy import copy_checkpoint, copy_folder
from outrig.sandbox.box import SandboxBox
from outrig.session import HostSession, Project
from tests.support.runs import box_workdir, host_a

pytestmark = pytest.mark.integration


def save(folder: Path, epoch: int, step: int, weights: str) -> None:
    """A complete speculators save, written in speculators' order (training_state.json last,
    and as new as every file)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in (("config.json", "{}"), ("model.safetensors", weights),
                       ("optimizer_state_dict.pt", "opt"), ("scheduler_state_dict.pt", "s")):
        (folder / name).write_text(text)
    (folder / "training_state.json").write_text(json.dumps(
        {"epoch": epoch, "local_step": step, "global_step": 10 * epoch + step}))
    stamp = time.time()
    for path in folder.iterdir():
        os.utime(path, (stamp, stamp))


def listing(session: HostSession, save_path: str) -> list[tuple[int, int, int | None, bool]]:
    found = assess(session.call("checkpoints", stream=False, save_path=save_path,
                                scheduler=True))
    return [(c.epoch, c.local_step, c.global_step, c.complete) for c in found]


def test_a_checkpoint_is_copied_to_the_second_box_complete_and_kept_current(
        box_a: SandboxBox, host_b: Path, tmp_path: Path) -> None:
    a = host_a(box_a, tmp_path)
    project, journal = Project(tmp_path), Journal(tmp_path / "state")
    trained = box_a.workdir / "ckpt"
    save(trained / "1", 1, 3, "weights at step 3")
    src = HostSession(project, str(a), Reporter(quiet=True), journal,
                      host=HostBook(project.hosts_dir)(str(a)))
    dest = HostSession(project, str(host_b), Reporter(quiet=True), journal,
                       host=HostBook(project.hosts_dir)(str(host_b)))
    try:
        [ckpt] = assess(src.call("checkpoints", stream=False, save_path=str(trained),
                                 scheduler=True))
        target = copy_checkpoint(src, dest, ckpt, "tiny", journal)
        assert target == copy_folder(dest, "tiny", 1)
        assert Path(target) == box_workdir(host_b) / "evaluations" / "tiny" / "1"
        assert listing(dest, str(Path(target).parent)) == [(1, 3, 13, True)]
        assert (Path(target) / "model.safetensors").read_text() == "weights at step 3"

        save(trained / "1", 1, 6, "weights at step 6")  # the folder rewritten in place
        [newer] = assess(src.call("checkpoints", stream=False, save_path=str(trained),
                                  scheduler=True))
        copy_checkpoint(src, dest, newer, "tiny", journal)
        assert listing(dest, str(Path(target).parent)) == [(1, 6, 16, True)]
        assert (Path(target) / "model.safetensors").read_text() == "weights at step 6"
        assert (Path(target) / "config.json").read_text() == "{}"
    finally:
        for session in (src, dest):
            session.transport.close()
