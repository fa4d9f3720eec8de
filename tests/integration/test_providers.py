"""Renting through the ``sandbox`` provider (real sshd boxes started on this machine, fake
GPUs): ``rent`` past every failure a provider gives (sold out, a box whose SSH never
answers, a bad GPU), the budget refusing, bad input refused before anything is rented, an
outrig killed mid-rent reconciled by ``boxes``, ``release`` refused under a live run, and the
whole loop: a rented box dies under ``watch --spare auto``, a new one is rented, the run
resumes there, the dead one is released, and ``boxes`` and the journal show the cost.

The tests wait for events and records, never for a time."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from outrig.console import Reporter
from outrig.errors import ConfigError, OutrigError
from outrig.journal import Journal
from outrig.ops.cleanup import cleanup
from outrig.ops.deploy import deploy
from outrig.ops.list_runs import runs_history
from outrig.ops.status import status
from outrig.ops.watch_record import WatchOptions
from outrig.providers import ledger
from outrig.providers import sandbox as market
from outrig.providers.base import CreateRequest, parse_gpus
from outrig.providers.budget import BudgetRefused
from outrig.providers.reconcile import boxes_lines, reconcile
from outrig.providers.renting import release, rent
from outrig.providers.spares import SpareTaken, rent_spare
from outrig.session import Project
from tests.integration.test_watch import PERIOD, THRESHOLD, Running
from tests.support.network import free_port
from tests.support.runs import kill_run, resumed_log, wait_checkpoints, write_playbooks

pytestmark = [pytest.mark.integration,
              pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")]
REPO = Path(__file__).resolve().parents[2]
H100 = "NVIDIA H100 80GB HBM3"


def offers(n: int) -> list[dict[str, Any]]:
    return [{"id": f"sb-h100-{i}", "gpus": 8, "gpu_name": H100, "price": 2.0 + i / 10,
             "disk_gb": 500} for i in range(1, n + 1)]


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Project]:
    """A project with the mig playbooks, its own state dir; every box the sandbox provider
    still has at the end is terminated."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    made = write_playbooks(tmp_path / "proj", free_port())
    (made.root / "outrig.yaml").write_text(yaml.safe_dump(
        {"providers": {"sandbox": {"ssh_deadline": 4}}}))
    yield made
    provider = market.SandboxProvider()
    for instance in provider.list():
        provider.terminate(instance.instance_id)


def set_yaml(project: Project, **keys: Any) -> None:
    path = project.root / "outrig.yaml"
    data = yaml.safe_load(path.read_text()) or {}
    data.update(keys)
    path.write_text(yaml.safe_dump(data))


def test_rent_passes_over_sold_out_silent_and_bad_gpu_offers(project: Project) -> None:
    market.set_market(offers=offers(4), faults={"no_capacity": 2, "no_ssh": 1, "bad_gpu": 1})
    journal = Journal()
    sent: list[tuple[str, dict[str, Any]]] = []
    result = rent(project, "sandbox", "8xH100", journal=journal,
                  send=lambda event, **f: sent.append((event, f)))
    # offer 1 sold out twice (asked again once), offer 2 never answered SSH, offer 3 came
    # with a bad GPU, offer 4 is the box
    assert result["offer"] == "sb-h100-4", result["tried"]
    assert [t.split(":")[0].split(" ")[0] for t in result["tried"]] == \
        ["sb-h100-1", "sb-h100-1", "sb-h100-2", "sb-h100-3"]
    assert "did not answer SSH" in result["tried"][2]
    assert "unhealthy GPU" in result["tried"][3]
    events = [e for e, _ in sent]
    assert events.count("rent_started") == 5 and events.count("released") == 2
    assert events[-1] == "rented" and sent[-1][1]["price_per_hour"] == pytest.approx(2.4)
    listed = market.SandboxProvider().list()
    assert [i.instance_id for i in listed] == [result["instance_id"]], \
        "the silent box and the bad-GPU box were terminated"
    host = yaml.safe_load(Path(result["host_file"]).read_text())
    assert host["provider"] == "sandbox" and host["instance_id"] == result["instance_id"]
    states = sorted(str(r["state"]) for r in journal.rentals())
    assert states == ["ready", "released", "released", "released", "released"]


def test_the_budget_refuses_and_says_which_limit_by_how_much(project: Project) -> None:
    market.set_market(offers=offers(2))
    set_yaml(project, budget={"max_price_per_hour": 2.0})
    with pytest.raises(BudgetRefused, match=r"max_price_per_hour \$2\.00/h would be crossed "
                                            r"by \$0\.10/h"):
        rent(project, "sandbox", "8xH100")
    assert market.SandboxProvider().list() == []
    set_yaml(project, budget={"max_boxes": 1})
    first = rent(project, "sandbox", "8xH100", name="one")
    with pytest.raises(BudgetRefused, match=r"max_boxes 1 would be crossed by 1: 1 box\(es\) "
                                            r"rented now \(one\)"):
        rent(project, "sandbox", "8xH100")
    assert [i.instance_id for i in market.SandboxProvider().list()] == [first["instance_id"]]


def outrig(project: Project, *args: str, env: dict[str, str] | None = None
           ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "outrig", *args], cwd=project.root,
                          capture_output=True, text=True, env={**os.environ, **(env or {})},
                          timeout=300, check=False)


@pytest.mark.parametrize(("args", "says"), [
    (["--provider", "nimbus", "--gpus", "8xH100"], "is not a provider outrig knows"),
    (["--provider", "sandbox", "--gpus", "8xB300"], "no offer of sandbox matches"),
    (["--provider", "sandbox", "--gpus", "eight"], "is not a GPU spec"),
    (["--provider", "sandbox", "--gpus", "8xH100", "--max-price", "1.5"],
     "is below every offer for 8xH100 (the cheapest is $2.49/h)"),
    (["--gpus", "8xH100"], "rent needs --provider and --gpus"),
])
def test_bad_input_exits_2_with_the_fix_and_rents_nothing(project: Project, args: list[str],
                                                          says: str) -> None:
    done = outrig(project, "rent", *args)
    assert done.returncode == 2, done.stderr
    assert says in " ".join(done.stderr.split()), done.stderr
    assert "Nothing was rented" in done.stderr
    assert market.SandboxProvider().list() == []
    assert not any((project.root / "hosts").glob("outrig-*.yaml"))


def test_an_outrig_killed_mid_rent_leaves_a_box_that_boxes_finds_and_release_ends(
        project: Project) -> None:
    market.set_market(faults={"no_ssh": 1})
    set_yaml(project, providers={"sandbox": {"ssh_deadline": 600}})
    proc = subprocess.Popen([sys.executable, "-m", "outrig", "rent", "--provider", "sandbox",
                             "--gpus", "8xH100", "--name", "half"], cwd=project.root,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    journal = Journal()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not any(
                r.get("instance_id") for r in journal.rentals()):
            assert proc.poll() is None, "rent waits for the silent box"
            time.sleep(0.1)
    finally:
        os.kill(proc.pid, signal.SIGKILL)  # our child, by its pid: outrig dies mid-rent
        proc.wait()
    doc = reconcile(project, journal)
    [box] = doc["boxes"]
    assert box["name"] == "half" and box["state"] == "starting"
    assert box["provider_state"] == "starting" and box["instance_id"]
    assert any("half" in line and "starting" in line for line in boxes_lines(doc))
    done = outrig(project, "release", "half", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["instance_id"] == box["instance_id"]
    assert market.SandboxProvider().list() == []
    assert reconcile(project, journal)["boxes"][0]["state"] == "released"


def test_boxes_marks_gone_and_orphans_and_release_refuses_a_box_with_our_run(
        project: Project) -> None:
    market.set_market(offers=offers(2))
    journal = Journal()
    kept = rent(project, "sandbox", "8xH100", name="kept", journal=journal)
    lost = rent(project, "sandbox", "8xH100", name="lost", journal=journal)
    provider = market.SandboxProvider()
    provider.terminate(lost["instance_id"])  # ended behind outrig's back
    stray = provider.create(provider.search(parse_gpus("8xH100"), None)[0],
                            CreateRequest(name="outrig-stray"))  # outrig never recorded it
    doc = reconcile(project, journal)
    states = {b["name"]: b["state"] for b in doc["boxes"]}
    assert states == {"kept": "ready", "lost": "gone"}
    assert [o["instance_id"] for o in doc["orphans"]] == [stray.instance_id]
    # begun when the box was rented: its share of the bill spans the rent's own wait for
    # SSH at least (a release right after a run recorded now would round its share to 0)
    rented_at = float((ledger.for_host(journal, "kept") or {})["created_at"])
    journal.record_run("r1", {"run_id": "r1", "host": "kept", "status": "running",
                              "created": rented_at})
    stopped: list[str] = []
    with pytest.raises(ConfigError, match="still has run\\(s\\) of ours: r1"):
        release(project, "kept", journal=journal, stop_runs=lambda p, box, j: stopped.append(box))
    assert stopped == [], "refused: nothing stopped"
    assert [i.instance_id for i in provider.list() if i.instance_id == kept["instance_id"]]
    done = release(project, "kept", force=True, journal=journal,
                   stop_runs=lambda p, box, j: stopped.append(box))
    assert stopped == ["kept"] and done["stopped_runs"] == ["r1"]
    assert done["cost"] > 0 and not (project.hosts_dir / "kept.yaml").exists()
    run = journal.run("r1") or {}
    assert run["cost"]["box"] == "kept" and run["cost"]["usd"] > 0


def test_two_watches_never_rent_twice_for_one_death(project: Project) -> None:
    market.set_market(offers=offers(2))
    set_yaml(project, spares={"provider": "sandbox", "gpus": "8xH100"})
    journal = Journal()
    first = rent_spare(project, journal, lambda *a, **k: None, "old", "run-1")
    with pytest.raises(SpareTaken, match=f"already: {first}"):
        rent_spare(project, journal, lambda *a, **k: None, "old", "run-1")
    assert len(market.SandboxProvider().list()) == 1


def test_a_rented_box_dies_under_watch_spare_auto_and_the_run_resumes_on_a_rented_one(
        project: Project) -> None:
    market.set_market(offers=offers(2))
    set_yaml(project, spares={"provider": "sandbox", "gpus": "8xH100", "release_dead": True},
             budget={"max_boxes": 2, "max_price_per_hour": 5})
    journal = Journal()
    a = rent(project, "sandbox", "8xH100", name="a", journal=journal)
    a_workdir = Path(yaml.safe_load(Path(a["host_file"]).read_text())["workdir"])
    first = deploy(project, "a", "mig-4gpu", Reporter(quiet=True), journal=journal)
    wait_checkpoints(a_workdir / "ckpt", 1)
    running = Running(project, "a", journal, WatchOptions(spares=["auto"],
                                                          threshold=THRESHOLD, period=PERIOD))
    new_box = None
    try:
        running.wait_record(lambda r: r.get("mirrored") is not None)
        market.power_off(a["instance_id"])  # the box dies: sshd, sessions, the runs
        kill_run(a_workdir, first.plan.run_id)
        resumed = running.wait_event("resumed", timeout=300)
        new_box = str(resumed["host"])
        events = running.events()
        assert events[:6] == ["suspect", "dead", "rent_started", "rented", "migrating",
                              "resumed"], events
        rented = running.wait_event("rented")
        assert rented["box"] == new_box and rented["price_per_hour"] == pytest.approx(2.1)
        assert rented["seconds"] > 0
        released = running.wait_event("released")
        assert released["box"] == "a" and released["cost"] > 0
        checkpoint = resumed["checkpoint"]
        assert checkpoint is not None
        b_workdir = Path(yaml.safe_load(
            (project.hosts_dir / f"{new_box}.yaml").read_text())["workdir"])
        assert f"Resuming training on epoch {checkpoint + 1}" in \
            resumed_log(b_workdir, resumed["run_id"])
        record = running.wait_record(lambda r: r.get("host") == new_box and bool(
            r.get("moved")) and r["moved"][0].get("stopped") == "box released")
        assert record["spares"] == ["auto"], "auto stays for a next death"
        assert (journal.run(first.plan.run_id) or {}).get("fenced"), \
            "a run on a terminated box is fenced in the journal"
        assert [i.instance_id for i in market.SandboxProvider().list()] == \
            [str(rented["instance_id"])], "the dead box is terminated; the new one runs"
        doc = reconcile(project, journal)
        by_name = {b["name"]: b for b in doc["boxes"]}
        assert by_name["a"]["state"] == "released" and by_name["a"]["cost"] > 0
        assert by_name[new_box]["state"] == "ready"
        assert by_name[new_box]["runs"][0]["run_id"] == resumed["run_id"]
        old = journal.run(first.plan.run_id) or {}
        assert old["cost"]["usd"] > 0 and old["cost"]["box"] == "a"
        shown = io.StringIO()
        history = runs_history(project, Reporter(out=shown, err=io.StringIO()),
                               journal=journal)
        costs = {r["run_id"]: r.get("cost") for r in history["runs"]}
        assert costs[first.plan.run_id]["usd"] > 0 and costs[resumed["run_id"]]["usd"] > 0
        assert "cost $" in shown.getvalue() and "(rented at $2.10/h)" in shown.getvalue()
        looked = io.StringIO()
        status(project, new_box, Reporter(out=looked, err=io.StringIO()),
               journal=journal)
        assert "rented from sandbox" in looked.getvalue() and "so far" in looked.getvalue()
        running.end()
        assert running.error is None
    finally:
        running.stop.set()
        if new_box is not None:
            cleanup(project, new_box, Reporter(quiet=True), all_runs=True, journal=journal)
        if (a_workdir / "runs").is_dir():  # released: its folder is gone with it
            kill_run(a_workdir, first.plan.run_id)


def test_outrig_boxes_and_release_from_the_command_line(project: Project) -> None:
    market.set_market(offers=offers(1))
    done = outrig(project, "rent", "--provider", "sandbox", "--gpus", "8xH100", "--name", "c")
    assert done.returncode == 0, done.stderr
    said = done.stdout + done.stderr
    assert "rented c from sandbox" in said and "$2.10/h" in said
    shown = outrig(project, "boxes")
    assert shown.returncode == 0 and "c " in shown.stdout and "ready" in shown.stdout
    gone = outrig(project, "release", "c")
    assert gone.returncode == 0 and "released c" in gone.stdout + gone.stderr, gone.stderr
    assert market.SandboxProvider().list() == []
    with pytest.raises(OutrigError):
        release(project, "c")


def test_a_spare_the_budget_does_not_allow_is_not_rented(project: Project) -> None:
    market.set_market(offers=offers(2))
    set_yaml(project, spares={"provider": "sandbox", "gpus": "8xH100"},
             budget={"max_total": 1.0})
    with pytest.raises(BudgetRefused, match=r"max_total \$1\.00 would be crossed by \$1\.10"):
        rent_spare(project, Journal(), lambda *a, **k: None, "old", "run-2")
    assert market.SandboxProvider().list() == []


def test_release_when_done_releases_the_box_of_a_finished_run_with_nothing_else_on_it(
        project: Project) -> None:
    from outrig.providers.spares import release_finished

    market.set_market(offers=offers(1))
    journal = Journal()
    box = rent(project, "sandbox", "8xH100", name="done", journal=journal)
    for run_id in ("r-finished", "r-other"):
        journal.record_run(run_id, {"run_id": run_id, "host": "done", "status": "running",
                                    "created": time.time()})
    sent: list[str] = []
    assert not release_finished(project, journal, lambda e, **f: sent.append(e), "done",
                                "r-finished"), "off unless release_when_done: true"
    set_yaml(project, release_when_done=True)
    assert not release_finished(project, journal, lambda e, **f: sent.append(e), "done",
                                "r-finished"), "r-other still runs there"
    journal.record_run("r-other", {"status": "finished"})
    assert release_finished(project, journal, lambda e, **f: sent.append(e), "done",
                            "r-finished")
    assert sent == ["released"]
    assert market.SandboxProvider().list() == [], box["instance_id"]
    assert (journal.run("r-finished") or {})["cost"]["box"] == "done", "its share recorded"


def test_a_spare_whose_move_failed_is_released_not_kept_paid_for(project: Project) -> None:
    from outrig.providers.spares import release_unused

    market.set_market(offers=offers(1))
    set_yaml(project, spares={"provider": "sandbox", "gpus": "8xH100"})
    journal = Journal()
    spare = rent_spare(project, journal, lambda *a, **k: None, "old", "run-3")
    assert not release_unused(project, journal, lambda *a, **k: None, spare, "run-4"), \
        "rented for another death: left alone"
    assert release_unused(project, journal, lambda *a, **k: None, spare, "run-3")
    assert market.SandboxProvider().list() == []


def test_demo_failover_shows_a_rented_box_taking_over_and_gives_everything_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    done = subprocess.run([sys.executable, "-m", "outrig", "demo", "--failover"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          check=False, env={**os.environ})
    said = done.stdout + done.stderr
    assert done.returncode == 0, said[-3000:]
    for line in ("rented failover-a", "• rent_started: failover-a", "• rented: failover-a",
                 "• resumed: ", "dead: released by watch"):
        assert line in said, line
    assert "failover-a        sandbox" in said and "released" in said, "boxes is shown"
    assert market.SandboxProvider().list() == [], "the demo released every box it rented"


def test_the_playbooks_spares_win_over_outrig_yaml_and_are_checked(project: Project) -> None:
    from outrig.providers.spares import spare_spec, spares_for_watch

    set_yaml(project, spares={"provider": "sandbox", "gpus": "8xH100", "max_price": 3})
    assert spare_spec(project, "mig-4gpu") == spare_spec(project)
    book = project.playbooks_dir / "mig-4gpu.yaml"
    data = yaml.safe_load(book.read_text())
    data["spares"] = {"provider": "sandbox", "gpus": "1xA100", "release_dead": True}
    book.write_text(yaml.safe_dump(data, sort_keys=False))
    spec = spare_spec(project, "mig-4gpu")
    assert spec is not None and spec.gpus == "1xA100" and spec.release_dead
    assert spares_for_watch(project, [], "mig-4gpu") == ["auto"]
    data["spares"] = {"provider": "nimbus", "gpus": "1xA100"}
    book.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(ConfigError, match=r"mig-4gpu.yaml: spares: provider 'nimbus'"):
        spare_spec(project, "mig-4gpu")
    path = project.root / "outrig.yaml"
    path.write_text(yaml.safe_dump({}))
    with pytest.raises(ConfigError, match="--spare auto rents the spare"):
        spares_for_watch(project, ["auto"], "mig-8gpu")
