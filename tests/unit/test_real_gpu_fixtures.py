"""The agent's nvidia-smi parsing and GPU audit against output captured from real NVIDIA H200s
(driver 580.159.04, CUDA 13.0; see docs/real-gpu.md). These run everywhere; the live runs
that produced the fixtures need a GPU machine (bench/real_gpu_check.py)."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from outrig._box.agent import gpus as box_gpus
from tests.support.agent import run_agent as harness_run_agent

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
ONE = FIXTURES / "h200-1gpu"
TWO = FIXTURES / "h200x2"
UUID0 = "GPU-ae2dcbb0-2c8e-fb2e-51dd-29fe02865859"
UUID1 = "GPU-5ff8e140-d059-ec35-6ccf-5903f7fde730"


@pytest.fixture(scope="module")
def agent() -> ModuleType:
    """The agent module under test, imported as any module is (outrig._box.agent.gpus)."""
    return box_gpus


def gpus(agent: ModuleType, path: Path) -> list[dict[str, Any]]:
    return list(agent.parse_gpu_csv(path.read_text()))


def apps(agent: ModuleType, path: Path) -> list[dict[str, Any]]:
    return list(agent.parse_compute_apps(path.read_text()))


@pytest.mark.parametrize("folder", [ONE, TWO], ids=["1gpu", "2gpu"])
def test_every_gpu_snapshot_parses_to_h200s(agent: ModuleType, folder: Path) -> None:
    for path in sorted(folder.glob("*-gpu.csv")):
        parsed = gpus(agent, path)
        assert parsed, path
        for gpu in parsed:
            assert gpu["name"] == "NVIDIA H200"
            assert gpu["memory_total_mib"] == 143771
            assert gpu["driver"] == "580.159.04"
            assert gpu["memory_used_mib"] + gpu["memory_free_mib"] <= gpu["memory_total_mib"]
            assert gpu["uuid"].startswith("GPU-")


def test_one_gpu_capture_tells_the_parent_kill_story(agent: ModuleType) -> None:
    busy = apps(agent, ONE / "busy-apps.csv")
    assert [a["pid"] for a in busy] == [786, 794, 795]
    assert sum(a["used_mib"] for a in busy) == 12070
    assert gpus(agent, ONE / "busy-gpu.csv")[0]["memory_used_mib"] == 12090
    # nvidia-smi names the executable, never the renamed VLLM:: title
    assert busy[1]["process_name"] == "/opt/torch/.venv/bin/python3"
    orphans = apps(agent, ONE / "after-parent-kill-apps.csv")
    assert [a["pid"] for a in orphans] == [794, 795]
    assert gpus(agent, ONE / "after-parent-kill-gpu.csv")[0]["memory_used_mib"] == 10451
    assert apps(agent, ONE / "after-group-kill-apps.csv") == []
    assert gpus(agent, ONE / "after-group-kill-gpu.csv")[0]["memory_used_mib"] == 0


def test_two_gpu_run_cleanup_and_placement(agent: ModuleType) -> None:
    summary = json.loads((TWO / "run-summary.json").read_text())
    assert all(summary["checks"].values())
    tree = summary["tree_pids"]
    busy = apps(agent, TWO / "busy-apps.csv")
    assert sorted(a["pid"] for a in busy) == sorted(tree["apps"])
    assert {a["gpu_uuid"] for a in busy} == {UUID0}
    survivors = {a["pid"] for a in apps(agent, TWO / "after-parent-kill-apps.csv")}
    assert tree["parent"][0] not in survivors and len(survivors) == 2
    assert gpus(agent, TWO / "after-parent-kill-gpu.csv")[0]["memory_used_mib"] == 10451
    assert apps(agent, TWO / "after-cleanup-apps.csv") == []
    assert [g["memory_used_mib"] for g in gpus(agent, TWO / "after-cleanup-gpu.csv")] == [0, 0]
    verdict = summary["cleanup"]["gpu"]
    assert verdict["released"] is True and verdict["freed_mib"]["0"] == 10451
    # gpus: [1] with CUDA_DEVICE_ORDER=PCI_BUS_ID: memory lands on physical GPU 1 only
    placed = gpus(agent, TWO / "placement-gpu1-gpu.csv")
    assert placed[0]["memory_used_mib"] == 0 and placed[1]["memory_used_mib"] > 4000
    assert placed[1]["uuid"] == UUID1 and placed[1]["pci_bus_id"] == "00000000:00:07.0"
    assert {a["gpu_uuid"] for a in apps(agent, TWO / "placement-gpu1-apps.csv")} == {UUID1}


def test_device_file_minor_does_not_tell_the_gpu(agent: ModuleType) -> None:
    """Every CUDA process opens /dev/nvidia0 and /dev/nvidia1, whatever it uses: so open
    device files only say *that* a process holds a GPU, never *which* one."""
    holders = json.loads((TWO / "placement-gpu1-nvfd.json").read_text())
    assert holders
    for info in holders.values():
        assert {"/dev/nvidia0", "/dev/nvidia1"} <= set(info["devices"])


def replay_smi(tmp_path: Path, gpu_csv: Path, apps_csv: Path) -> Path:
    """An nvidia-smi that answers the agent's two queries with captured real output."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script = bindir / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\ncase \"$1\" in\n"
        f"  --query-gpu=*) cat '{gpu_csv}' ;;\n"
        f"  --query-compute-apps=*) cat '{apps_csv}' ;;\n"
        "  *) exit 2 ;;\nesac\n")
    script.chmod(0o755)
    return bindir


def run_agent(request: dict[str, Any]) -> list[dict[str, Any]]:
    """The agent run as the transports run it (tests/support/agent.py)."""
    return harness_run_agent(request)


def test_agent_audit_classifies_real_output(tmp_path: Path) -> None:
    bindir = replay_smi(tmp_path, TWO / "after-parent-kill-gpu.csv",
                        TWO / "after-parent-kill-apps.csv")
    events = run_agent({"op": "cleanup", "workdir": str(tmp_path / "w"), "all": True,
                        "dry_run": True, "env": {"PATH": f"{bindir}:$PATH"}})
    result = events[-1]
    assert result["ok"] is True, result
    audit = result["gpus_before"]
    assert [g["memory_used_mib"] for g in audit["gpus"]] == [10451, 0]
    smi_holders = [h for h in audit["holders"] if h["source"] == "nvidia-smi"]
    assert sorted(h["used_mib"] for h in smi_holders) == [3682, 6754]
    assert all(h["gpu_index"] == 0 and h["owner"] is None for h in smi_holders)
