"""The GPU health judge (remote/agent/gpu_judge.py) over the real H200 capture and over each
fault a rented box comes with; the sandbox's fake nvidia-smi and dmesg checked field for
field against the same capture; the agent's probe (one nvidia-smi query, dmesg beside it)
against them; and the workstation's memory of the last look (outrig/hosts/gpu_health.py)."""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from outrig._box.agent import gpu_judge, gpus
from outrig.hosts import gpu_health
from outrig.journal import Journal
from outrig.sandbox import dmesg, nvidia_smi

REPO = Path(__file__).resolve().parents[2]
CAPTURE = REPO / "tests" / "fixtures" / "h200-health" / "gpu-health.txt"
# The capture asks the old name and driver 580 answers under the new header.
RENAMED = {"clocks_event_reasons.active": "clocks_throttle_reasons.active",
           "power.draw [W]": "power.draw"}


def capture_sections() -> list[str]:
    return CAPTURE.read_text().split("===\n")


def capture_query() -> tuple[list[str], list[str]]:
    """The capture's ``--query-gpu`` header and its one GPU line, as cells."""
    section = next(s for s in capture_sections() if s.startswith("index, uuid"))
    header, line = section.strip().splitlines()
    return [c.strip() for c in header.split(",")], [c.strip() for c in line.split(",")]


def capture_health() -> dict[str, str]:
    header, cells = capture_query()
    named = {RENAMED.get(h, h): c for h, c in zip(header, cells, strict=True)}
    return {k: v for k, v in named.items() if k in gpu_judge.HEALTH_FIELDS}


def capture_kernel_lines() -> list[str]:
    section = next(s for s in capture_sections() if "NVRM:" in s)
    return [line for line in section.splitlines() if line.startswith("[")]


def h200(health: dict[str, str], index: int = 0) -> dict[str, Any]:
    return {"index": index, "uuid": f"GPU-{index}", "pci_bus_id": nvidia_smi.bus_id(index),
            "health": health}


def by_check(verdict: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["check"]: f for f in verdict["findings"]}


# ---------------------------------------------------------------- the real capture


def test_the_healthy_h200_capture_is_ok_on_every_field_it_has() -> None:
    health = capture_health()
    verdict = gpu_judge.judge_gpu(h200(health), {"lines": capture_kernel_lines(),
                                                 "error": None})
    checks = by_check(verdict)
    assert {c: f["verdict"] for c, f in checks.items()} == {
        "ecc": "ok", "remap": "ok", "clocks": "ok", "xid": "ok",
        # the capture has no pcie.link.width.max: unknown, never ok by accident
        "pcie": "unknown"}
    assert checks["pcie"]["field"] == "pcie.link.width.max"
    assert verdict["verdict"] == "unknown"
    # retired pages answer [N/A] on Hopper: row remapping replaces them, judged ok
    assert health["retired_pages.pending"] == "[N/A]"
    assert verdict["corrected"] == 0


def test_the_capture_with_the_h200s_link_maxima_is_ok() -> None:
    """With the card's maxima (gen 5, x16: what the probe asks too) every check is ok."""
    health = {**capture_health(), "pcie.link.gen.max": "5", "pcie.link.width.max": "16"}
    verdict = gpu_judge.judge_gpu(h200(health), {"lines": capture_kernel_lines(),
                                                 "error": None})
    assert verdict["verdict"] == "ok", gpu_judge.summary(verdict)
    assert gpu_judge.summary(verdict) == "GPU 0 ok"


def test_the_fake_answers_the_captured_query_field_for_field(tmp_path: Path) -> None:
    header, cells = capture_query()
    nvidia_smi.write_inventory(tmp_path, nvidia_smi.make_inventory(1, 143771, "NVIDIA H200"))
    spec = ",".join(RENAMED.get(h, h).split(" [")[0] for h in header)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert nvidia_smi.main([f"--query-gpu={spec}", "--format=csv"], tmp_path) == 0
    fake_header, fake_line = out.getvalue().strip().splitlines()
    assert fake_header == ", ".join(header)
    fake = fake_line.split(", ")
    for name, real, mine in zip(header, cells, fake, strict=True):
        if name != "uuid":  # each box has its own
            assert mine == real, name


def test_the_fake_answers_the_captured_remapped_rows_query(tmp_path: Path) -> None:
    section = next(s for s in capture_sections() if s.startswith("gpu_bus_id"))
    header, line = section.strip().splitlines()
    nvidia_smi.write_inventory(tmp_path, nvidia_smi.make_inventory(1, 143771, "NVIDIA H200"))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        spec = header.replace(" ", "")
        assert nvidia_smi.main([f"--query-remapped-rows={spec}", "--format=csv"],
                               tmp_path) == 0
    assert out.getvalue().strip().splitlines() == [header, line]


def test_the_fake_kernel_log_is_the_captured_one(tmp_path: Path) -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert dmesg.main([], tmp_path) == 0
    assert out.getvalue().splitlines() == [line.rstrip("\n") for line in
                                          capture_kernel_lines()]


# ---------------------------------------------------------------- each fault, via the fake


def fake_gpu(tmp_path: Path, fault: str | None, busy: bool = False) -> dict[str, Any]:
    """GPU 0 of a fake 2-GPU box with ``fault``, read with the agent's own query and parser."""
    nvidia_smi.write_inventory(tmp_path, nvidia_smi.make_inventory(2, 143771, "NVIDIA H200"))
    if fault is not None:
        nvidia_smi.set_gpu_health(tmp_path, 0, fault)
    if busy:
        nvidia_smi.register_holder(tmp_path, 1, 0, 4096)  # pid 1 is always alive
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert nvidia_smi.main([f"--query-gpu={gpus.GPU_QUERY},{gpus.HEALTH_QUERY}",
                                "--format=csv,noheader,nounits"], tmp_path) == 0
    return gpus.parse_gpu_csv(out.getvalue(), health=True)[0]


CLEAN_LOG = {"lines": [], "error": None}


@pytest.mark.parametrize(("fault", "verdict", "field", "words"), [
    ("uncorrectable_ecc", "bad", "ecc.errors.uncorrected.volatile.total",
     ["2 uncorrectable ECC error(s)", "nvidia-smi -r -i 0", "ask the provider for another box"]),
    ("remap_pending", "bad", "remapped_rows.pending",
     ["a row remap is pending", "reset the GPU"]),
    ("remap_failure", "bad", "remapped_rows.failure",
     ["a row remap failed", "ask the provider for another box"]),
    ("retired_pending", "bad", "retired_pages.pending", ["page retirement is pending"]),
    ("thermal_slowdown", "warn", "clocks_throttle_reasons.active",
     ["HW thermal slowdown active", "GPU at 91 C", "cooling"]),
    ("power_brake", "warn", "clocks_throttle_reasons.active", ["HW power brake slowdown"]),
    ("slow_pstate", "warn", "pstate", ["busy in P-state P8"]),
    ("pcie_x4", "warn", "pcie.link.width.current", ["x4 of the card's x16", "reseat"]),
    ("ecc_off", "warn", "ecc.mode.current", ["ECC is off", "nvidia-smi -e 1 -i 0"]),
    ("not_supported", "unknown", "ecc.errors.uncorrected.volatile.total",
     ["does not report"]),
])
def test_each_fault_is_judged_with_its_field_and_fix(tmp_path: Path, fault: str, verdict: str,
                                                     field: str, words: list[str]) -> None:
    judged = gpu_judge.judge_gpu(fake_gpu(tmp_path, fault), CLEAN_LOG)
    assert judged["verdict"] == verdict, gpu_judge.summary(judged)
    text = gpu_judge.summary(judged)
    assert text.startswith(f"GPU 0 {verdict}: ") and field in text
    for word in words:
        assert word in text
    assert next(f["field"] for f in judged["findings"] if f["verdict"] == verdict) == field


def test_a_healthy_fake_gpu_is_ok_idle_and_busy(tmp_path: Path) -> None:
    for busy in (False, True):
        judged = gpu_judge.judge_gpu(fake_gpu(tmp_path / str(busy), None, busy), CLEAN_LOG)
        assert judged["verdict"] == "ok", gpu_judge.summary(judged)


def test_correctable_errors_warn_only_when_rising(tmp_path: Path) -> None:
    gpu = fake_gpu(tmp_path, "correctable_ecc")
    assert gpu_judge.judge_gpu(gpu, CLEAN_LOG)["verdict"] == "ok", "no earlier look"
    same = {"uuid": gpu["uuid"], "corrected": 37}
    assert gpu_judge.judge_gpu(gpu, CLEAN_LOG, same)["verdict"] == "ok", "not rising"
    lower = {"uuid": gpu["uuid"], "corrected": 3}
    rising = gpu_judge.judge_gpu(gpu, CLEAN_LOG, lower)
    assert rising["verdict"] == "warn"
    assert "correctable ECC errors rising (3 → 37" in gpu_judge.summary(rising)
    other = {"uuid": "GPU-another-card", "corrected": 3}
    assert gpu_judge.judge_gpu(gpu, CLEAN_LOG, other)["verdict"] == "ok", \
        "another card's count says nothing about this one"


def test_a_busy_gpu_on_a_slower_link_generation_warns_an_idle_one_does_not() -> None:
    health = {**capture_health(), "pcie.link.gen.max": "5", "pcie.link.width.max": "16",
              "pcie.link.gen.current": "3"}
    idle = gpu_judge.judge_gpu(h200(health), CLEAN_LOG)
    assert idle["verdict"] == "ok", "an idle GPU lowers its link generation to save power"
    busy = gpu_judge.judge_gpu(h200({**health, "clocks_throttle_reasons.active":
                                     "0x0000000000000000"}), CLEAN_LOG)
    assert busy["verdict"] == "warn"
    assert "busy on a PCIe gen 3 link" in gpu_judge.summary(busy)


def test_no_health_fields_at_all_is_unknown_with_the_reason() -> None:
    why = 'nvidia-smi failed (exit 2): Field "remapped_rows.pending" is not a valid field'
    judged = gpu_judge.judge_gpu({"index": 1, "uuid": "GPU-1"}, CLEAN_LOG, health_error=why)
    assert judged["verdict"] == "unknown"
    assert why in gpu_judge.summary(judged)


# ---------------------------------------------------------------- Xids


def test_a_fatal_xid_makes_its_gpu_bad_and_no_other() -> None:
    healthy = {**capture_health(), "pcie.link.gen.max": "5", "pcie.link.width.max": "16"}
    log = {"lines": [*capture_kernel_lines(),
                     dmesg.xid_line(nvidia_smi.bus_id(1), 79, 5012.25)], "error": None}
    facts = {"gpus": [h200(healthy, 0), h200(healthy, 1)], "xid": log}
    zero, one = gpu_judge.judge_facts(facts)
    assert zero["verdict"] == "ok"
    assert one["verdict"] == "bad"
    text = gpu_judge.summary(one)
    assert "Xid 79 in the kernel log" in text and "GPU has fallen off the bus" in text
    assert "5012 s after boot" in text and "reboot the box" in text


def test_an_xid_of_no_gpu_of_the_box_counts_for_every_gpu() -> None:
    healthy = {**capture_health(), "pcie.link.gen.max": "5", "pcie.link.width.max": "16"}
    log = {"lines": [dmesg.xid_line("00000000:9A:00.0", 48)], "error": None}
    verdicts = gpu_judge.judge_facts({"gpus": [h200(healthy, 0), h200(healthy, 1)],
                                      "xid": log})
    assert [v["verdict"] for v in verdicts] == ["bad", "bad"]


def test_an_applications_xid_is_seen_but_not_fatal() -> None:
    healthy = {**capture_health(), "pcie.link.gen.max": "5", "pcie.link.width.max": "16"}
    log = {"lines": [dmesg.xid_line(nvidia_smi.bus_id(0), 13, pid=4242)], "error": None}
    verdict = gpu_judge.judge_gpu(h200(healthy), log)
    assert verdict["verdict"] == "ok"
    assert "not fatal: Xid 13" in by_check(verdict)["xid"]["why"]


@pytest.mark.parametrize("xid", [48, 63, 64, 74, 79, 92, 94, 95])
def test_the_fatal_set_holds_the_xids_that_need_a_reset_or_another_box(xid: int) -> None:
    assert xid in gpu_judge.FATAL_XIDS
    line = dmesg.xid_line(nvidia_smi.bus_id(0), xid)
    assert gpu_judge.parse_xid_lines([line])[0]["xid"] == xid


def test_a_refused_kernel_log_is_unknown_not_ok_and_not_a_failure() -> None:
    healthy = {**capture_health(), "pcie.link.gen.max": "5", "pcie.link.width.max": "16"}
    verdict = gpu_judge.judge_gpu(h200(healthy), {"lines": None, "error": dmesg.DENIED})
    assert verdict["verdict"] == "unknown"
    xid = by_check(verdict)["xid"]
    assert dmesg.DENIED in xid["why"] and "dmesg_restrict" in xid["fix"]


# ---------------------------------------------------------------- the agent's probe


@pytest.fixture
def box_bin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The sandbox's fake nvidia-smi and dmesg on the PATH of this process, 2 H200s."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name, module in (("nvidia-smi", nvidia_smi), ("dmesg", dmesg)):
        script = bindir / name
        script.write_text(f"#!{sys.executable}\n{Path(str(module.__file__)).read_text()}")
        script.chmod(0o755)
    state = tmp_path / "gpu"
    nvidia_smi.write_inventory(state, nvidia_smi.make_inventory(2, 143771, "NVIDIA H200"))
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    monkeypatch.setenv(nvidia_smi.STATE_ENV, str(state))
    monkeypatch.setattr(gpus, "_health_refused", [])
    return state


def test_the_probe_reads_health_and_xids_in_the_facts(box_bin: Path) -> None:
    dmesg.write_kernel_log(box_bin, [dmesg.xid_line(nvidia_smi.bus_id(1), 64)])
    facts = gpus.gather_facts()
    assert [g["health"]["remapped_rows.pending"] for g in facts["gpus"]] == ["No", "No"]
    assert facts["xid"]["error"] is None and len(facts["xid"]["lines"]) == 1
    assert facts["gpu_health_error"] is None
    assert [v["verdict"] for v in gpu_judge.judge_facts(facts)] == ["ok", "bad"]


def test_a_refused_kernel_log_reads_as_its_message(box_bin: Path) -> None:
    dmesg.write_kernel_log(box_bin, denied=True)
    facts = gpus.gather_facts()
    assert facts["xid"] == {"lines": None, "error": dmesg.DENIED}
    assert len(facts["gpus"]) == 2, "the GPUs are there all the same"


def test_an_older_driver_without_the_fields_still_gives_the_inventory(box_bin: Path) -> None:
    nvidia_smi.refuse_fields(box_bin, ["remapped_rows.pending"])
    found, error = gpus.query_gpus()
    assert error is None and [g["index"] for g in found] == [0, 1]
    assert all(g.get("health") is None for g in found)
    why = gpus.health_refusal()
    assert why is not None and '"remapped_rows.pending" is not a valid field' in why
    facts = gpus.gather_facts()
    verdicts = gpu_judge.judge_facts(facts)
    assert [v["verdict"] for v in verdicts] == ["unknown", "unknown"]
    assert why in gpu_judge.summary(verdicts[0])


# ---------------------------------------------------------------- the workstation's memory


def test_the_journal_remembers_the_last_look(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "state")
    healthy = {**capture_health(), "pcie.link.gen.max": "5", "pcie.link.width.max": "16"}
    facts = {"gpus": [h200(healthy, 0)], "xid": CLEAN_LOG}
    first, before = gpu_health.look(journal, "box", facts)
    assert before == {} and first[0]["verdict"] == "ok"
    assert gpu_health.newly_bad(first, before) == []
    worse = {"gpus": [h200({**healthy, "ecc.errors.corrected.volatile.total": "5",
                            "remapped_rows.pending": "Yes"}, 0)], "xid": CLEAN_LOG}
    second, before = gpu_health.look(journal, "box", worse)
    assert second[0]["verdict"] == "bad"
    assert {f["check"]: f["verdict"] for f in second[0]["findings"]}["ecc_corrected"] == "warn"
    assert [v["index"] for v in gpu_health.newly_bad(second, before)] == [0]
    third, before = gpu_health.look(journal, "box", worse)
    assert gpu_health.newly_bad(third, before) == [], "news once, not at every look"
    event = gpu_health.event_fields(third[0])
    assert event["gpu"] == 0 and event["field"] == "remapped_rows.pending"
    assert "reset the GPU" in str(event["fix"])
    assert gpu_health.health_head(third) == "GPU health: 0 bad"


@pytest.mark.parametrize("lie", ["nan", "-nan", "inf", "-inf", "1e400", "-3", "2.5",
                                 "0x1ffffffffffffffff", "NaN W"])
def test_every_numeric_field_that_lies_is_unknown_with_its_field_never_ok(lie: str) -> None:
    """Each numeric health field answered with a value that is not a finite, in-range,
    whole number: the GPU is ``unknown`` (never ``ok``, no exception) and the finding names
    the field and the value. Before: ``nan``/``-3`` ECC judged ok, ``inf`` and ``1e400`` an
    OverflowError, ``nan`` clocks a ValueError."""
    for field in gpu_judge.RANGES:
        health = {**capture_health(), field: lie}
        verdict = gpu_judge.judge_gpu({"index": 0, "uuid": "GPU-x", "health": health},
                                      {"lines": [], "error": None})
        assert verdict["verdict"] == "unknown", (field, verdict)
        named = [f for f in verdict["findings"] if f["field"] == field]
        assert [f["verdict"] for f in named] == ["unknown"], (field, verdict["findings"])
        assert repr(lie) in named[0]["why"]


@pytest.mark.parametrize("lie", ["nan", "inf", "1e400", "-3"])
def test_an_inventory_number_that_lies_is_none_and_named(lie: str) -> None:
    line = f"0, GPU-x, NVIDIA H200, {lie}, 0, 143156, 0, 00000000:00:06.0, 580.159.04"
    [gpu] = gpus.parse_gpu_csv(line)
    assert gpu["memory_total_mib"] is None and gpu["bad_values"] == {"memory.total": lie}
    verdict = gpu_judge.judge_gpu(gpu, {"lines": [], "error": None})
    assert verdict["verdict"] == "unknown"
    assert any(f["field"] == "memory.total" and f["verdict"] == "unknown"
               for f in verdict["findings"])


@pytest.mark.parametrize("shape, util", [("stopped", "0"), ("collective", "100")])
def test_the_fake_answers_a_hung_gpu_as_the_h200_captures_did(
        tmp_path: Path, shape: str, util: str) -> None:
    """tests/fixtures/h200-hang/: a SIGSTOPped rank read 0 %, a rank spinning in a wait
    100 %; the memory is the holders' as before, and None gives the GPU back."""
    samples = REPO / "tests" / "fixtures" / "h200-hang" / "samples-capture2.jsonl"
    captured = [json.loads(line) for line in samples.read_text().splitlines()]
    phase = {"stopped": "rank-stopped", "collective": "spinning"}[shape]
    assert {row["util_pct"] for row in captured if row["phase"] == phase} == {util}
    nvidia_smi.write_inventory(tmp_path, nvidia_smi.make_inventory(1, 143771, "NVIDIA H200"))

    def query() -> str:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert nvidia_smi.main(["--query-gpu=utilization.gpu,memory.total",
                                    "--format=csv,noheader,nounits"], tmp_path) == 0
        return out.getvalue().strip()

    healthy = query()
    nvidia_smi.set_gpu_hang(tmp_path, 0, shape)
    assert query() == f"{util}, 143771"
    nvidia_smi.set_gpu_hang(tmp_path, 0, None)
    assert query() == healthy
    with pytest.raises(ValueError, match="hang shape"):
        nvidia_smi.set_gpu_hang(tmp_path, 0, "frozen")
