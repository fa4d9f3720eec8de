"""``cleanup`` end to end on the sandbox: exactly our processes die, GPUs are proven free,
foreign processes live. The vLLM stand-in reproduces the real tree (renamed spawn children in
the group, a setsid escapee, a child that ignores SIGTERM) and the fake nvidia-smi keeps their
"GPU memory" until they are really gone."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from outrig.console import Reporter
from outrig.errors import RemoteError
from outrig.journal import Journal
from outrig.ops.cleanup import CleanupIncomplete, cleanup
from outrig.ops.deploy import deploy
from outrig.sandbox.nvidia_smi import gpu_rows, register_holder
from outrig.session import Project
from tests.support.network import free_port
from tests.support.processes import alive, children, group_members, marked, wait_gone
from tests.support.runs import stop_recorded_runs, write_playbook

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
PROJECT = Project(REPO)


FOREIGN_FOLDERS: list[Path] = []


@pytest.fixture(autouse=True)
def _stop_what_a_failed_test_left(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that fails before its own cleanup would leave its run (renamed vLLM children
    that no marker finds): stop it by the box's records."""
    host = request.getfixturevalue("box_host") if "box_host" in request.fixturenames else None
    yield
    if host is not None:
        stop_recorded_runs(Path(yaml.safe_load(host.read_text())["workdir"]))


@pytest.fixture(autouse=True)
def _remove_foreign_folders() -> Iterator[None]:
    yield
    while FOREIGN_FOLDERS:
        shutil.rmtree(FOREIGN_FOLDERS.pop(), ignore_errors=True)


def gpu_dir_of(host_file: Path) -> Path:
    return Path(yaml.safe_load(host_file.read_text())["env"]["OUTRIG_FAKE_GPU_DIR"])


def used(host_file: Path) -> dict[int, int]:
    return {int(r["index"]): int(r["memory.used"]) for r in gpu_rows(gpu_dir_of(host_file))}






def wait_for(predicate: Any, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return bool(predicate())


def collecting_reporter() -> tuple[Reporter, io.StringIO]:
    buffer = io.StringIO()
    return Reporter(json_mode=True, out=buffer), buffer


def events(buffer: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in buffer.getvalue().splitlines() if line.strip()]


def start_foreign(procs: Any, tmp_path: Path, host_file: Path, gpu: int, mib: int,
                  name: str = "train.py") -> subprocess.Popen[Any]:
    """Somebody else's `python train.py` on the box, holding GPU memory (as another user when
    the tests run as root)."""
    # Its own world-readable folder: pytest's tmp_path is private to root.
    folder = Path(tempfile.mkdtemp(prefix="outrig-foreign-"))
    FOREIGN_FOLDERS.append(folder)
    folder.chmod(0o755)
    script = folder / name
    script.write_text("import time\nwhile True:\n    time.sleep(1)\n")
    script.chmod(0o644)
    kwargs: dict[str, Any] = {}
    if os.geteuid() == 0:
        kwargs["user"] = 65534  # nobody
    proc: subprocess.Popen[Any] = procs.spawn(["python3", name, "--epochs", "5"],
                                               cwd=str(folder), **kwargs)
    time.sleep(0.3)
    assert alive(proc.pid), "the foreign stand-in must be running"
    register_holder(gpu_dir_of(host_file), proc.pid, gpu, mib)
    return proc


def vllm_and_trainer(tmp_path: Path, standin: Any, *, extra_env: dict[str, str] | None = None,
                     name: str = "dflash") -> Path:
    port = free_port()
    return write_playbook(tmp_path, {
        "params": {"port": port},
        "processes": {
            "server": {
                "command": [sys.executable, str(standin("fake_vllm")), "serve", "m",
                            "--tensor-parallel-size", "2", "--data-parallel-size", "1",
                            "--port", "${port}", "--host", "127.0.0.1",
                            "--fake-startup-delay", "0.3"],
                "env": {"FAKE_VLLM_SETSID_CHILD": "1", "FAKE_VLLM_IGNORE_TERM_CHILD": "1",
                        **(extra_env or {})},
                "gpus": [0, 1], "parallel": {"tensor": 2, "data": 1},
                "ready": {"http": "http://127.0.0.1:${port}/health", "timeout": 60},
                "stop": {"grace": 3},
            },
            "trainer": {
                "after": "server",
                "command": [sys.executable, str(standin("fake_trainer")),
                            "--verifier-name-or-path", "m",
                            "--vllm-endpoint", "http://127.0.0.1:${port}/v1",
                            "--save-path", "${run_dir}/checkpoints", "--epochs", "50",
                            "--fake-step-seconds", "0.05"],
                "gpus": [2, 3],
                "ready": {"log": "global_step=", "timeout": 60},
                "stop": {"grace": 10},
            },
        },
    }, name)


def test_cleanup_after_pkill9_of_vllm_frees_gpus_and_spares_the_foreign_process(
        box_host: Path, tmp_path: Path, standin: Any, procs: Any) -> None:
    journal = Journal(tmp_path / "state")
    quiet = Reporter(quiet=True)
    result = deploy(PROJECT, str(box_host), str(vllm_and_trainer(tmp_path, standin)), quiet,
                    journal=journal)
    run_id = result.plan.run_id
    foreign = start_foreign(procs, tmp_path, box_host, gpu=4, mib=7000)
    assert wait_for(lambda: all(used(box_host)[g] > 0 for g in (0, 1, 2, 3)))

    # What `pkill -9 -f vllm` does: SIGKILL the vLLM API process (the wrapper's child).
    server_leader = result.processes[0]["pid"]
    vllm_pids = children(server_leader)
    assert vllm_pids, "the server's real process runs under outrig's wrapper"
    os.kill(vllm_pids[0], signal.SIGKILL)
    assert wait_gone([server_leader], 30) == []  # the wrapper ends with its child
    survivors = group_members(server_leader)
    assert survivors, "renamed children outlive their parent (vLLM #55510)"
    assert used(box_host)[0] > 0 and used(box_host)[1] > 0, "and keep their GPU memory"
    renamed = [p for p in survivors
               if Path(f"/proc/{p}/comm").read_text().strip().startswith("VLLM::")]
    assert renamed
    # renamed like setproctitle does: no marker left, so only the group (and what outrig
    # recorded while the deploy waited) proves them the run's
    assert not set(renamed) & set(marked(run_id))

    reporter, buffer = collecting_reporter()
    report = cleanup(PROJECT, str(box_host), reporter, playbook="dflash", journal=journal,
                     timeout=20)

    assert wait_gone(survivors, 5) == [] and marked(run_id) == []
    assert group_members(server_leader) == []
    assert alive(foreign.pid), "a process outrig did not start is never killed"
    gpus = used(box_host)
    assert [gpus[g] for g in (0, 1, 2, 3)] == [0, 0, 0, 0]
    assert gpus[4] == 7000
    verdict = report["gpu"]
    assert verdict["released"] is True
    assert verdict["freed_mib"]["0"] > 0 if "0" in verdict["freed_mib"] else \
        verdict["freed_mib"][0] > 0
    stopped = {p["process"]: p for p in report["runs"][0]["processes"]}
    assert {"server", "trainer"} <= set(stopped)
    assert stopped["trainer"]["how"] == "term"
    assert stopped["server"]["stragglers"] >= 1 or "(marker sweep)" in stopped
    holders = report["gpus_after"]["holders"]
    assert [h["pid"] for h in holders] == [foreign.pid]
    assert holders[0]["owner"] is None and holders[0]["gpu_index"] == 4
    if os.geteuid() == 0:
        assert holders[0]["user"] == "nobody"
    assert journal.run(run_id)["status"] == "stopped"  # type: ignore[index]
    assert any(e.get("event") == "stopped" for e in events(buffer))


def test_memory_that_does_not_come_back_is_reported_plainly(
        box_host: Path, tmp_path: Path, standin: Any) -> None:
    port = free_port()
    playbook = write_playbook(tmp_path, {"processes": {"server": {
        "command": [sys.executable, str(standin("fake_vllm")), "serve", "m",
                    "--port", str(port), "--fake-startup-delay", "0.2"],
        "env": {"FAKE_VLLM_LEAK_MIB": "2048"}, "gpus": [0],
        "ready": {"http": f"http://127.0.0.1:{port}/health", "timeout": 60},
        "stop": {"grace": 3}}}}, "leaky")
    journal = Journal(tmp_path / "state")
    deploy(PROJECT, str(box_host), str(playbook), Reporter(quiet=True), journal=journal)
    with pytest.raises(CleanupIncomplete) as info:
        cleanup(PROJECT, str(box_host), Reporter(quiet=True), playbook="leaky",
                journal=journal, timeout=2)
    text = str(info.value)
    assert "memory did not come back on GPU 0 (2048 MiB)" in text
    assert "only a reboot frees it" in text
    assert info.value.exit_code == 1


def test_cleanup_with_no_runs_and_twice(box_host: Path, tmp_path: Path) -> None:
    journal = Journal(tmp_path / "state")
    empty = cleanup(PROJECT, str(box_host), Reporter(quiet=True), all_runs=True,
                    journal=journal)
    assert empty["runs"] == [] and empty["gpu"]["released"] is True
    playbook = write_playbook(tmp_path, {"processes": {"a": {
        "command": [sys.executable, "-c", "import time; time.sleep(600)"],
        "stop": {"grace": 2}}}}, "twice")
    result = deploy(PROJECT, str(box_host), str(playbook), Reporter(quiet=True),
                    journal=journal)
    first = cleanup(PROJECT, str(box_host), Reporter(quiet=True), playbook="twice",
                    journal=journal)
    assert first["runs"][0]["processes"][0]["how"] == "term"
    assert wait_gone([result.processes[0]["pid"]]) == []
    reporter, buffer = collecting_reporter()
    second = cleanup(PROJECT, str(box_host), reporter, playbook="twice", journal=journal)
    assert second["runs"] == []
    assert any(e.get("event") == "warning" and "no current run" in e.get("msg", "")
               for e in events(buffer))


def test_a_process_that_finished_is_said_to_have_finished(box_host: Path,
                                                          tmp_path: Path) -> None:
    """cleanup's table said `was not running` of a one-shot step that had finished with exit
    0, as of one that had died. The box's exit record now says how each had ended."""
    journal = Journal(tmp_path / "state")
    playbook = write_playbook(tmp_path, {"processes": {
        "once": {"command": [sys.executable, "-c", "print('done')"], "ready": {"exit": True}},
        "failing": {"command": [sys.executable, "-c", "import time, sys; time.sleep(4); "
                                "sys.exit(3)"], "after": "once"},
        "long": {"command": [sys.executable, "-c", "import time; time.sleep(600)"],
                 "after": "once", "stop": {"grace": 2}}}}, "oneshot")
    deploy(PROJECT, str(box_host), str(playbook), Reporter(quiet=True), journal=journal)
    workdir = Path(yaml.safe_load(box_host.read_text())["workdir"])
    assert wait_for(lambda: list(workdir.rglob("exit/failing.json")) != [])  # its wrapper's
    out = io.StringIO()
    result = cleanup(PROJECT, str(box_host), Reporter(out=out, err=io.StringIO()),
                     playbook="oneshot", journal=journal)
    procs = {p["process"]: p for p in result["runs"][0]["processes"]}
    assert procs["once"]["how"] == "gone" and procs["once"]["exit_code"] == 0, procs
    assert procs["failing"]["how"] == "gone" and procs["failing"]["exit_code"] == 3, procs
    assert procs["long"]["how"] == "term" and "exit_code" not in procs["long"], procs
    table = out.getvalue()
    assert "had finished (exit 0)" in table and "had exited 3" in table, table
    assert "was not running" not in table, table


@pytest.mark.parametrize("how", ["reboot", "pid-reuse"])
def test_recorded_pids_now_belonging_to_others_are_not_touched(
        box_host: Path, tmp_path: Path, procs: Any, how: str) -> None:
    journal = Journal(tmp_path / "state")
    playbook = write_playbook(tmp_path, {"processes": {"a": {
        "command": [sys.executable, "-c", "import time; time.sleep(600)"],
        "stop": {"grace": 1}}}}, "boot")
    result = deploy(PROJECT, str(box_host), str(playbook), Reporter(quiet=True),
                    journal=journal)
    record = result.processes[0]
    # The box "rebooted": our process is gone and an unrelated one now has the recorded pid
    # (we cannot force pid reuse, so we point the record at an unrelated live process).
    os.killpg(record["pgid"], signal.SIGKILL)
    assert wait_gone([record["pid"]]) == []
    bystander = procs.spawn([sys.executable, "-c", "import time; time.sleep(600)"])
    workdir = Path(yaml.safe_load(box_host.read_text())["workdir"])
    run_file = workdir / "runs" / result.plan.run_id / "run.json"
    run = json.loads(run_file.read_text())
    stat = Path(f"/proc/{bystander.pid}/stat").read_text().rsplit(")", 1)[1].split()
    rec = run["processes"][0]
    rec.update(pid=bystander.pid, pgid=bystander.pid, sid=bystander.pid)
    if how == "reboot":
        rec["boot_id"] = "00000000-0000-0000-0000-000000000000"
        rec["start_ticks"] = int(stat[19])
    else:
        rec["start_ticks"] = int(stat[19]) + 12345
    run_file.write_text(json.dumps(run))

    report = cleanup(PROJECT, str(box_host), Reporter(quiet=True), playbook="boot",
                     journal=journal)
    time.sleep(0.3)
    assert alive(bystander.pid)
    assert report["runs"][0]["processes"][0]["how"] == ("gone" if how == "reboot" else "reused")


def test_a_strangers_session_with_a_dead_leaders_pid_is_not_touched(
        box_host: Path, tmp_path: Path, procs: Any) -> None:
    # The leader ended; a stranger got its pid and made a session (and group) with that id,
    # forked `sleep 600` and exited (we cannot force the pid through SSH, so the record is
    # pointed at the stranger's pid; tests/unit/test_agent_pid_reuse.py has the real reuse).
    journal = Journal(tmp_path / "state")
    playbook = write_playbook(tmp_path, {"processes": {"a": {
        "command": [sys.executable, "-c", "import time; time.sleep(600)"],
        "stop": {"grace": 1}}}}, "reuse")
    result = deploy(PROJECT, str(box_host), str(playbook), Reporter(quiet=True),
                    journal=journal)
    record = result.processes[0]
    os.killpg(record["pgid"], signal.SIGKILL)
    assert wait_gone([record["pid"]]) == []
    out = tmp_path / "sleeper.pid"
    stranger = procs.spawn([sys.executable, "-c",  # a session of its own: spawn gives it one
                            "import subprocess, sys\n"
                            "p = subprocess.Popen(['sleep', '600'])\n"
                            "open(sys.argv[1], 'w').write(str(p.pid))\n", str(out)])
    assert stranger.wait(timeout=30) == 0
    sleeper = int(out.read_text())
    workdir = Path(yaml.safe_load(box_host.read_text())["workdir"])
    run_file = workdir / "runs" / result.plan.run_id / "run.json"
    run = json.loads(run_file.read_text())
    run["processes"][0].update(pid=stranger.pid, pgid=stranger.pid, sid=stranger.pid)
    run_file.write_text(json.dumps(run))

    report = cleanup(PROJECT, str(box_host), Reporter(quiet=True), playbook="reuse",
                     journal=journal)
    stopped = report["runs"][0]["processes"]
    assert [(p["process"], p["stragglers"]) for p in stopped] == [("a", 0)]
    assert alive(sleeper), "the stranger's child was killed as the run's straggler"


def test_corrupt_manifest_still_sweeps_by_marker(box_host: Path, tmp_path: Path) -> None:
    journal = Journal(tmp_path / "state")
    playbook = write_playbook(tmp_path, {"processes": {"a": {
        "command": [sys.executable, "-c",
                    "import os, subprocess, time\n"
                    "subprocess.Popen(['sleep', '600'], start_new_session=True)\n"
                    "time.sleep(600)"],
        "stop": {"grace": 1}}}}, "corrupt")
    result = deploy(PROJECT, str(box_host), str(playbook), Reporter(quiet=True),
                    journal=journal)
    run_id = result.plan.run_id
    assert wait_for(lambda: len(marked(run_id)) >= 3)  # wrapper, python, escaped sleep
    workdir = Path(yaml.safe_load(box_host.read_text())["workdir"])
    (workdir / "runs" / run_id / "run.json").write_text("{not json")
    reporter, buffer = collecting_reporter()
    report = cleanup(PROJECT, str(box_host), reporter, run_id=run_id, journal=journal)
    assert wait_gone(marked(run_id), 5) == [] and marked(run_id) == []
    assert [p["process"] for p in report["runs"][0]["processes"]] == ["(marker sweep)"]
    assert any(e.get("event") == "warning" and "sweeping for its marker" in e.get("msg", "")
               for e in events(buffer))


def test_deploy_refuses_foreign_held_gpus_until_force_foreign(
        box_host: Path, tmp_path: Path, procs: Any) -> None:
    journal = Journal(tmp_path / "state")
    sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
    first = write_playbook(tmp_path, {"processes": {"a": {
        "command": sleeper, "gpus": [1], "stop": {"grace": 1}}}}, "job")
    running = deploy(PROJECT, str(box_host), str(first), Reporter(quiet=True), journal=journal)
    old_pid = running.processes[0]["pid"]
    register_holder(gpu_dir_of(box_host), old_pid, 1, 1000)  # our own previous run holds GPU 1
    foreign = start_foreign(procs, tmp_path, box_host, gpu=0, mib=5000)
    other = start_foreign(procs, tmp_path, box_host, gpu=5, mib=100, name="other.py")
    wider = tmp_path / "wider"
    wider.mkdir()
    second = write_playbook(wider, {"processes": {"a": {
        "command": sleeper, "gpus": [0, 1], "stop": {"grace": 1}}}}, "job")

    with pytest.raises(RemoteError) as info:
        deploy(PROJECT, str(box_host), str(second), Reporter(quiet=True), journal=journal)
    text = str(info.value)
    assert info.value.kind == "gpu_busy"
    assert f"GPU 0: pid {foreign.pid}" in text and "not outrig's" in text
    assert f"outrig cleanup --host {box_host} --force-foreign {foreign.pid}" in text
    assert "Nothing was stopped or started" in text
    assert alive(old_pid), "the previous run is untouched when the deploy is refused"
    workdir = Path(yaml.safe_load(box_host.read_text())["workdir"])
    assert len(list((workdir / "runs").iterdir())) == 1

    forced = cleanup(PROJECT, str(box_host), Reporter(quiet=True),
                     force_foreign=[str(foreign.pid)], journal=journal)
    assert wait_gone([foreign.pid]) == []
    assert alive(other.pid), "only the listed pid is killed"
    assert forced["forced"][0]["pid"] == foreign.pid
    assert forced["forced"][0]["how"] in {"term", "kill"}
    assert forced["runs"] == [] and alive(old_pid)

    replaced = deploy(PROJECT, str(box_host), str(second), Reporter(quiet=True),
                      journal=journal)
    assert wait_gone([old_pid]) == []
    assert alive(replaced.processes[0]["pid"])
    cleanup(PROJECT, str(box_host), Reporter(quiet=True), all_runs=True, journal=journal)


def test_cli_dry_run_signals_nothing(box_host: Path, tmp_path: Path) -> None:
    journal = Journal(tmp_path / "state")
    playbook = write_playbook(tmp_path, {"processes": {"a": {
        "command": [sys.executable, "-c", "import time; time.sleep(600)"],
        "stop": {"grace": 1}}}}, "dry")
    result = deploy(PROJECT, str(box_host), str(playbook), Reporter(quiet=True),
                    journal=journal)
    pid = result.processes[0]["pid"]
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}
    done = subprocess.run([sys.executable, "-m", "invoke", "--search-root", str(REPO), "cleanup",
                           "--host", str(box_host), "--all", "--dry-run", "--json"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["dry_run"] is True
    assert report["runs"][0]["processes"][0]["pid"] == pid
    assert alive(pid)
    bad = subprocess.run([sys.executable, "-m", "invoke", "--search-root", str(REPO), "cleanup",
                          "--host", str(box_host)], capture_output=True, text=True, env=env,
                         timeout=60)
    assert bad.returncode == 2 and "say what to clean up" in bad.stderr
    cleanup(PROJECT, str(box_host), Reporter(quiet=True), all_runs=True, journal=journal)
    assert wait_gone([pid]) == []
