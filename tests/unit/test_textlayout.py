"""Output for people at 80 columns: plan and status render real documents without breaking a
command into fragments, and the GPUs of a real H200 capture read as one line."""

from __future__ import annotations

import io
import shlex
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from outrig._box.agent import gpus as box_gpus
from outrig.console import Reporter
from outrig.inventory import Host
from outrig.ops.status import enrich_status, print_status
from outrig.plan import HostFacts, Plan, make_plan
from outrig.playbook import load_job
from outrig.text.layout import command_lines, gpu_summary, ranges

REPO = Path(__file__).resolve().parents[2]
TWO = REPO / "tests" / "fixtures" / "h200x2"
WIDTH = 80


@pytest.fixture(scope="module")
def agent() -> ModuleType:
    """The agent's GPU parsers, imported as any module is (outrig._box.agent.gpus)."""
    return box_gpus


def narrow(width: int = WIDTH, **kw: Any) -> tuple[Reporter, io.StringIO]:
    out = io.StringIO()
    reporter = Reporter(out=out, err=io.StringIO(), **kw)
    reporter.stdout_console.width = width
    return reporter, out


def fits(lines: list[str], width: int = WIDTH) -> list[str]:
    """Lines wider than ``width`` that could have been broken (one unbreakable word, such as
    a long path on its own line, is allowed to run past)."""
    return [line for line in lines if len(line) > width and " " in line.strip()]


def command_block(lines: list[str], argv: list[str]) -> list[str]:
    """The lines that show ``argv``: the line starting with its first word and the deeper
    indented lines after it."""
    first = shlex.quote(argv[0])
    for i, line in enumerate(lines):
        if line.strip() == first or line.strip().startswith(first + " "):
            indent = len(line) - len(line.lstrip())
            block = [line]
            for more in lines[i + 1:]:
                if len(more) - len(more.lstrip()) <= indent:
                    break
                block.append(more)
            if [w for b in block for w in shlex.split(b)] == argv:
                return block
    raise AssertionError(f"{argv[:3]}... is not shown whole:\n" + "\n".join(lines))


def eight_gpu_plan() -> Plan:
    job = load_job(REPO / "playbooks" / "dflash-qwen36-8x96.yaml")
    host = Host(name="uk-node", hostname="127.0.0.1", workdir="/workspace/dflash")
    plan = make_plan(job, host, HostFacts(gpu_count=8, gpu_memory_mib=97_871), "run-1")
    assert plan.ok, plan.problems
    return plan


@pytest.mark.parametrize("full", [False, True], ids=["deploy", "plan"])
def test_plan_at_80_columns_shows_every_command_whole(full: bool) -> None:
    plan = eight_gpu_plan()
    reporter, out = narrow()
    reporter.plan(plan, full=full)
    lines = out.getvalue().splitlines()
    assert fits(lines) == []
    for name in plan.order:
        block = command_block(lines, plan.processes[name].argv)
        for line in block:  # every line of it holds whole words of the command
            shlex.split(line)
    assert any("TP2×DP3" in line for line in lines)  # the short fields stay in the row


def test_short_commands_stay_on_one_line_and_long_ones_go_one_option_a_line() -> None:
    assert command_lines(["python3", "-m", "http.server", "8765"], WIDTH) == \
        ["    python3 -m http.server 8765"]
    long = ["torchrun", "--nproc_per_node", "2", "train.py", "--save-path", "/d/" + "x" * 70,
            "--lr", "6e-4"]
    lines = command_lines(long, WIDTH)
    assert lines[0] == "    torchrun"
    assert "        --lr 6e-4" in lines and "        --save-path" in lines
    assert [w for line in lines for w in shlex.split(line)] == long


def capture_status(agent: ModuleType, ours: dict[int, tuple[str, str]]) -> dict[str, Any]:
    """A status document whose GPUs and holders are the real 2×H200 capture (busy), with
    the pids in ``ours`` owned by (run, process)."""
    gpus = list(agent.parse_gpu_csv((TWO / "busy-gpu.csv").read_text()))
    index = {g["uuid"]: g["index"] for g in gpus}
    holders = []
    for app in agent.parse_compute_apps((TWO / "busy-apps.csv").read_text()):
        owner = ours.get(app["pid"])
        holders.append({"gpu_index": index[app["gpu_uuid"]], "pid": app["pid"],
                        "used_mib": app["used_mib"], "comm": Path(app["process_name"]).name,
                        "user": "root",
                        "owner": {"run_id": owner[0], "process": owner[1]} if owner else None})
    return {"runs": [], "facts": {"gpus": gpus}, "gpu_holders": holders}


def test_gpus_of_a_real_capture_read_as_one_line(agent: ModuleType) -> None:
    result = enrich_status(capture_status(agent, {723: ("dflash-1", "trainer")}))
    assert gpu_summary(result["gpus"]) == (
        "gpus: 2× NVIDIA H200 140 GiB · 0 ours (trainer of run dflash-1) · 1 free · "
        "0 held by pid 726 python3 (not ours) · 0 held by pid 725 python3 (not ours)")


def test_eight_gpus_summarise_as_ranges(agent: ModuleType) -> None:
    one = list(agent.parse_gpu_csv((TWO / "busy-gpu.csv").read_text()))[1]
    gpus = [{**one, "index": i, "holders": []} for i in range(8)]
    for i in range(4):
        gpus[i]["holders"] = [{"pid": 900 + i, "ours": True, "run_id": "X",
                               "process": "server"}]
    gpus[6]["holders"] = [{"pid": 123, "ours": False, "comm": "python3"}]
    assert gpu_summary(gpus) == ("gpus: 8× NVIDIA H200 140 GiB · 0-3 ours (server of run X) · "
                                 "4-5,7 free · 6 held by pid 123 python3 (not ours)")
    assert ranges([5, 0, 1, 2, 7, 3]) == "0-3,5,7"


def status_document(agent: ModuleType) -> dict[str, Any]:
    result = capture_status(agent, {723: ("dflash-20260101-000000-abcd", "trainer")})
    result["runs"] = [{
        "run_id": "dflash-20260101-000000-abcd", "playbook": "dflash-qwen36",
        "status": "running",
        "processes": [
            {"name": "server", "state": "running", "pid": 701, "uptime": 3600.0,
             "ready": True, "argv": ["vllm", "serve"],
             "server": {"health": 200, "models": ["/workspace/dflash/models/Qwen3.6-27B"]},
             "log_tail": []},
            {"name": "trainer", "state": "running", "pid": 723, "uptime": 3500.0,
             "ready": True, "argv": ["torchrun"], "log_tail": [],
             "checkpoint": {"path": "/workspace/dflash/runs/dflash-20260101-000000-abcd/"
                                    "checkpoints/4", "count": 5,
                            "save_path": "/workspace/dflash/runs/x/checkpoints"}},
            {"name": "prepare", "state": "exited", "exit_code": 3, "pid": 702,
             "uptime": None, "ready": False, "argv": ["python3"],
             "log_tail": ["Traceback (most recent call last): File \"/opt/speculators/"
                          "scripts/prepare.py\", line 12, in <module> ValueError: the "
                          "data path /workspace/dflash/data/convs.jsonl holds no "
                          "conversations at all"]},
        ]}]
    return enrich_status(result)


@pytest.mark.parametrize("table", [False, True], ids=["summary", "gpus"])
def test_status_at_80_columns(agent: ModuleType, table: bool) -> None:
    reporter, out = narrow(gpu_table=table)
    print_status(reporter, status_document(agent))
    lines = out.getvalue().splitlines()
    assert fits(lines) == []
    text = out.getvalue()
    # long values are whole, on their own lines
    path = "/workspace/dflash/runs/dflash-20260101-000000-abcd/checkpoints/4"
    assert any(line.strip() == path or line.strip().endswith(f": {path}") for line in lines)
    assert "exited (3)" in text and "holds no" in text
    if table:
        assert "trainer (pid 723 1634 MiB, run dflash-20260101-000000-abcd)" in text
        assert "NOT OURS: pid 726 python3 3682 MiB" in text
        assert not any(line.startswith("gpus: ") for line in lines)
    else:
        start = next(i for i, line in enumerate(lines) if line.startswith("gpus: "))
        shown = [lines[start]] + [line.removeprefix("    · ") for line in lines[start + 1:]]
        assert " · ".join(shown) == (
            "gpus: 2× NVIDIA H200 140 GiB · 0 ours (trainer of run dflash-20260101-000000-abcd)"
            " · 1 free · 0 held by pid 726 python3 (not ours) · 0 held by pid 725 python3 "
            "(not ours)")
        assert "GPUs" not in lines


@pytest.mark.parametrize("table", [False, True], ids=["summary", "gpus"])
def test_cleanup_reports_the_gpus_after_in_one_line_unless_asked(agent: ModuleType,
                                                                 table: bool) -> None:
    from outrig.ops.cleanup import print_report

    def audit(name: str, ours: dict[int, tuple[str, str]]) -> dict[str, Any]:
        gpus = list(agent.parse_gpu_csv((TWO / f"{name}-gpu.csv").read_text()))
        index = {g["uuid"]: g["index"] for g in gpus}
        holders = [{"gpu_index": index[a["gpu_uuid"]], "pid": a["pid"], "used_mib": a["used_mib"],
                    "comm": "python3", "user": "root",
                    "owner": ({"run_id": ours[a["pid"]][0], "process": ours[a["pid"]][1]}
                              if a["pid"] in ours else None)}
                   for a in agent.parse_compute_apps((TWO / f"{name}-apps.csv").read_text())]
        return {"gpus": gpus, "holders": holders}

    reporter, out = narrow(gpu_table=table)
    print_report(reporter, {"runs": [], "gpus_before": audit("busy", {723: ("r", "trainer")}),
                            "gpus_after": audit("after-cleanup", {}), "gpu": {}})
    text = out.getvalue()
    if table:
        assert "GPUs" in text and "used before → after MiB" in text
    else:
        assert text.splitlines()[0].startswith("gpus: 2× NVIDIA H200 140 GiB")
        assert "ours" not in text and "→" not in text
    assert fits(text.splitlines()) == []


def smoke_document() -> dict[str, Any]:
    """A smoke run as the agent reports it: a server, a trainer with its checkpoints, and
    the processes of a run that cleanup stopped."""
    return enrich_status({"facts": {}, "runs": [{
        "run_id": "smoke-20260101-000000-abcd", "playbook": "smoke", "status": "running",
        "processes": [
            {"name": "server", "state": "running", "pid": 701, "uptime": 60.0, "ready": True,
             "argv": ["python3"], "log_tail": ["GET / 200", "GET /a 200", "GET /b 200"]},
            {"name": "trainer", "state": "running", "pid": 702, "uptime": 59.0, "ready": True,
             "argv": ["python3", "train.py"],
             "log_tail": ["train/loss=0.300, epoch=4, global_step=70",
                          "train/loss=0.200, epoch=4, global_step=71"],
             "checkpoint": {"save_path": "/w/smoke/checkpoints", "path": "/w/smoke/checkpoints/3",
                            "name": "3", "count": 5,
                            "incomplete": [{"name": "4", "why": "missing model.safetensors, "
                                            "training_state.json"}]}},
        ]}, {
        "run_id": "smoke-20251231-000000-dcba", "playbook": "smoke", "status": "stopped",
        "processes": [
            {"name": "trainer", "state": "killed", "signal": 15, "stopped_by": "cleanup",
             "pid": 600, "uptime": None, "ready": None, "argv": ["python3"], "log_tail": []},
            {"name": "crasher", "state": "killed", "signal": 15, "stopped_by": None,
             "pid": 601, "uptime": None, "ready": None, "argv": ["python3"], "log_tail": []},
        ]}]})


def test_status_shows_as_many_log_lines_per_process_as_asked() -> None:
    """`--lines N` asks the box for N lines of each log; status printed one line per running
    process whatever N was. Each process's lines follow its own row, in order."""
    reporter, out = narrow()
    print_status(reporter, smoke_document())
    lines = out.getvalue().splitlines()
    server = next(i for i, line in enumerate(lines) if line.lstrip().startswith("server "))
    trainer = next(i for i, line in enumerate(lines) if line.lstrip().startswith("trainer "))
    assert [line.strip() for line in lines[server + 1:trainer]] == [
        "| GET / 200", "| GET /a 200", "| GET /b 200"]
    assert "| train/loss=0.300, epoch=4, global_step=70" in out.getvalue()
    assert "| train/loss=0.200, epoch=4, global_step=71" in out.getvalue()
    none = smoke_document()
    for run in none["runs"]:
        for proc in run["processes"]:
            proc["log_tail"] = []  # `--lines 0`
    reporter, out = narrow()
    print_status(reporter, none)
    assert "|" not in out.getvalue()


def test_status_says_why_a_newer_checkpoint_is_not_complete() -> None:
    reporter, out = narrow()
    print_status(reporter, smoke_document())
    text = out.getvalue()
    assert fits(text.splitlines()) == []
    words = " ".join(text.split())  # as read, across the wrapped line
    assert "trainer: newest complete checkpoint (5 saved): /w/smoke/checkpoints/3" in words
    assert ("trainer: checkpoint 4 is not complete: missing model.safetensors, "
            "training_state.json") in words


def test_status_names_cleanup_as_what_stopped_a_process() -> None:
    reporter, out = narrow()
    print_status(reporter, smoke_document())
    rows = {line.split()[0]: line for line in out.getvalue().splitlines()
            if line.startswith("  ") and line.split() and line.split()[0] in ("trainer",
                                                                              "crasher")}
    assert "stopped by cleanup" in rows["trainer"] and "signal" not in rows["trainer"]
    assert "killed (signal 15)" in rows["crasher"]  # not ours: a signal from elsewhere
