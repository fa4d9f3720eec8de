"""``stage`` and ``sync-checkpoints`` on the sandbox: every route, verification, idempotence
(a re-run moves nothing and costs one exec), resume after a cut, and checkpoint completeness."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from outrig.connectors.ssh.transport import SSHTransport
from outrig.console import Reporter
from outrig.errors import OutrigError
from outrig.inventory import HostBook
from outrig.journal import Journal
from outrig.ops.stage import mirror_root, stage, sync_checkpoints
from outrig.sandbox.box import SandboxBox
from outrig.session import Project
from tests.support.trees import checkpoint, make_tree, same_tree, sha

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
PROJECT = Project(REPO)


def second_host(sandbox: SandboxBox, tmp_path: Path, name: str, **changes: Any) -> Path:
    """Another "box" on the same sshd: its own workdir, GPUs and known_hosts."""
    folder = tmp_path / name
    workdir = folder / "workdir"
    workdir.mkdir(parents=True)
    from outrig.sandbox.nvidia_smi import load_inventory, write_inventory

    write_inventory(folder / "gpu", load_inventory(sandbox.gpu_dir))
    path = sandbox.write_host_file(folder / f"{name}.yaml", workdir=workdir,
                                   gpu_dir=folder / "gpu", known_hosts=folder / "known_hosts")
    if changes:
        config = yaml.safe_load(path.read_text())
        config.update(changes)
        path.write_text(yaml.safe_dump(config))
    return path


def playbook(tmp_path: Path, stage_items: dict[str, Any], name: str = "job") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "stage": stage_items, "processes": {
        "a": {"command": "true"}}}))
    return path


class ExecCounter:
    """Counts agent execs (SSH session channels) during a block."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        original = SSHTransport.start

        def counted(transport: SSHTransport, argv: list[str], **kw: Any) -> Any:
            self.count += 1
            return original(transport, argv, **kw)

        monkeypatch.setattr(SSHTransport, "start", counted)


def test_workstation_folder_is_pushed_verified_then_rerun_moves_nothing(
        box_host: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = tmp_path / "dataset"
    make_tree(source, {"a.arrow": 300_000, "sub/b.arrow": 1_200_000, "empty.txt": 0,
                       "state.json": 100})
    box_data = tmp_path / "box-data"
    book = playbook(tmp_path, {"data": {"path": str(box_data), "source": str(source)}})
    journal = Journal(tmp_path / "state")
    first = stage(PROJECT, str(box_host), str(book), Reporter(quiet=True), journal=journal)
    assert first["items"][0]["route"] == "workstation"
    assert first["items"][0]["bytes"] == 1_500_100
    assert same_tree(source, box_data)
    assert not list(box_data.rglob("*.outrig-part"))
    # The user's folder is read, never written: the sha256 cache lives in outrig's state dir.
    assert sorted(p.name for p in source.rglob("*")) == [
        "a.arrow", "b.arrow", "empty.txt", "state.json", "sub"]
    caches = list((journal.root / "manifests").glob("*.json"))
    assert len(caches) == 1 and "sub/b.arrow" in json.loads(caches[0].read_text())

    counter = ExecCounter(monkeypatch)
    again = stage(PROJECT, str(box_host), str(book), Reporter(quiet=True), journal=journal)
    assert again["items"][0]["route"] == "present" and again["items"][0]["bytes"] == 0
    assert counter.count == 1, "a re-run on a staged box is one agent exec"

    # A file changed behind outrig's back: the mark no longer matches, only it is re-sent.
    (box_data / "state.json").write_bytes(b"tampered")
    fixed = stage(PROJECT, str(box_host), str(book), Reporter(quiet=True), journal=journal)
    assert fixed["items"][0]["route"] == "workstation"
    assert fixed["items"][0]["bytes"] == 100 and same_tree(source, box_data)


def test_cut_transfer_resumes_from_the_part_file(
        box_host: Path, tmp_path: Path, make_proxy: Any) -> None:
    source = tmp_path / "model"
    make_tree(source, {"model.safetensors": 24_000_000})
    config = yaml.safe_load(box_host.read_text())
    proxy = make_proxy(config["port"], one_way_delay=0.02)
    config["port"] = proxy.port
    slow = tmp_path / "slow.yaml"
    slow.write_text(yaml.safe_dump(config))
    box_model = tmp_path / "box-model"
    book = playbook(tmp_path, {"model": {"path": str(box_model), "source": str(source),
                                         "kind": "model"}})
    journal = Journal(tmp_path / "state")
    part = box_model / "model.safetensors.outrig-part"
    errors: list[BaseException] = []

    def run() -> None:
        try:
            stage(PROJECT, str(slow), str(book), Reporter(quiet=True), journal=journal,
                  streams=1)
        except BaseException as exc:
            errors.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (part.exists() and part.stat().st_size > 2e6):
        time.sleep(0.02)
    assert part.exists(), "the transfer had started"
    proxy.cut_all()
    worker.join(60)
    assert errors and isinstance(errors[0], OutrigError), errors
    # The box-side receiver may still write what reached sshd before the cut: wait until the
    # part file stops growing, so ``had`` is what the resumed run will start from.
    had = -1
    while had != part.stat().st_size:
        had = part.stat().st_size
        time.sleep(1.0)
    assert 0 < had < 24_000_000

    resumed = stage(PROJECT, str(slow), str(book), Reporter(quiet=True), journal=journal)
    moved = resumed["items"][0]["bytes"]
    assert moved == 24_000_000 - had, "only what was missing is sent again"
    assert sha(box_model / "model.safetensors") == sha(source / "model.safetensors")
    assert not part.exists()


def test_from_another_box_copies_directly_and_removes_the_key(
        sandbox: SandboxBox, box_host: Path, tmp_path: Path) -> None:
    old = second_host(sandbox, tmp_path, "old")
    old_data = tmp_path / "old-data"
    make_tree(old_data, {"x.arrow": 2_000_000, "d/y.arrow": 10_000})
    new_data = tmp_path / "new-data"
    report = stage_from(old, box_host, old_data, new_data, Journal(tmp_path / "state"))
    assert report["route"] == "peer", report
    assert same_tree(old_data, new_data)
    keys_file = Path(yaml.safe_load(old.read_text())["env"]["OUTRIG_AUTHORIZED_KEYS"])
    assert "outrig-transfer:" not in keys_file.read_text(), "the throwaway key is removed"


def stage_from(old: Path, new: Path, old_path: Path, new_path: Path,
               journal: Journal) -> dict[str, Any]:
    """Stage one folder from OLD's path to NEW's path (different paths: one machine)."""
    from outrig.ops.stage import Stager, box_manifest
    from outrig.session import HostSession

    reporter = Reporter(quiet=True)
    src = HostSession(PROJECT, str(old), reporter, journal,
                      host=HostBook(PROJECT.hosts_dir)(str(old)))
    dest = HostSession(PROJECT, str(new), reporter, journal,
                       host=HostBook(PROJECT.hosts_dir)(str(new)))
    try:
        stager = Stager(reporter, journal)
        src_listing = box_manifest(src, [("d", str(old_path))], verify=True)["d"]
        dest_listing = box_manifest(dest, [("d", str(new_path))])["d"]
        try:
            moved = stager.peer(src, str(old_path), src_listing, dest, str(new_path),
                                dest_listing, "data", f"old:{old_path}")
            return {"route": "peer", **moved}
        except OutrigError:
            moved = stager.relay(src, str(old_path), src_listing, dest, str(new_path),
                                 dest_listing, "data", f"old:{old_path}")
            return {"route": "relay", **moved}
    finally:
        src.close()
        dest.close()


def test_relay_through_the_workstation_when_the_boxes_cannot_see_each_other(
        sandbox: SandboxBox, box_host: Path, tmp_path: Path) -> None:
    old = second_host(sandbox, tmp_path, "old")
    config = yaml.safe_load(box_host.read_text())
    config["env"]["PATH"] = config["env"]["PATH"].split(":")[0]  # no ssh on the new box
    blind = tmp_path / "blind.yaml"
    blind.write_text(yaml.safe_dump(config))
    old_data = tmp_path / "old-data"
    make_tree(old_data, {"x.arrow": 1_500_000, "y.arrow": 700_000, "z.arrow": 5})
    new_data = tmp_path / "new-data"
    report = stage_from(old, blind, old_data, new_data, Journal(tmp_path / "state"))
    assert report["route"] == "relay" and report["bytes"] == 2_200_005
    assert same_tree(old_data, new_data)


def assert_same_times_and_complete(source: Path, copy: Path) -> None:
    """A copy keeps each file's mtime, so the completeness rule (the training state is
    written last) judges the copy as it judged the source; without it a parallel copy
    left small files newer than training_state.json and the checkpoint was quarantined."""
    from outrig._box.agent.checkpoints import checkpoint_entry

    for path in source.iterdir():
        if path.name.startswith(".outrig-"):  # outrig's own cache and mark, not copied
            continue
        assert (copy / path.name).stat().st_mtime_ns == path.stat().st_mtime_ns, path.name
    entry = checkpoint_entry(str(copy), True, None)
    assert entry["complete"], entry


def test_sync_checkpoints_mirrors_only_complete_ones_then_resume_from_mirror(
        sandbox: SandboxBox, box_host: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    save = tmp_path / "ckpt-old"
    checkpoint(save, 0)
    checkpoint(save, 1)
    checkpoint(save, 2, complete=False)  # being written: never chosen
    (save / "interrupted").mkdir()
    (save / "interrupted" / "training_state.json").write_text("{}")
    os.symlink("1", save / "checkpoint_best")
    book = playbook(tmp_path, {"ckpt": {"path": str(save), "kind": "checkpoints"}},
                    name="trainjob")
    journal = Journal(tmp_path / "state")
    report = sync_checkpoints(PROJECT, str(box_host), Reporter(quiet=True),
                              playbook=str(book), journal=journal)
    assert [p["epoch"] for p in report["pulled"]] == [0, 1]
    assert [s["epoch"] for s in report["not_complete"]] == [2]
    assert "interrupted" in report["others"]
    mirror = mirror_root("trainjob")
    assert same_tree(save / "1", mirror / "1") and not (mirror / "2").exists()
    assert_same_times_and_complete(save / "1", mirror / "1")
    again = sync_checkpoints(PROJECT, str(box_host), Reporter(quiet=True),
                             playbook=str(book), journal=journal)
    assert again["pulled"] == [], "incremental: nothing new, nothing moved"

    # A fresh box resumes from the mirror's newest complete checkpoint.
    new = second_host(sandbox, tmp_path, "new")
    new_save = tmp_path / "ckpt-new"
    new_book = playbook(tmp_path, {"ckpt": {"path": str(new_save), "kind": "checkpoints"}},
                        name="trainjob")
    staged = stage(PROJECT, str(new), str(new_book), Reporter(quiet=True), resume=True,
                   journal=journal)
    assert staged["checkpoint"]["epoch"] == 1 and staged["checkpoint"]["route"] == "mirror"
    assert same_tree(save / "1", new_save / "1")
    assert_same_times_and_complete(save / "1", new_save / "1")
