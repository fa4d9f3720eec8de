"""The GPU health judge over a real H200's answer (tests/fixtures/h200-gpu-health) and over
each fault, written as the same CSV with one field changed."""

from __future__ import annotations

from pathlib import Path

import pytest

from outrig.gpu_health import FATAL_XIDS, judge, parse_query, xids

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "h200-gpu-health"
REAL_QUERY = (FIXTURE / "query-gpu.csv").read_text()
REAL_DMESG = (FIXTURE / "dmesg-nvrm.txt").read_text()

HEADER = ("index, name, pci.bus_id, ecc.errors.corrected.volatile.total, "
          "ecc.errors.uncorrected.volatile.total, remapped_rows.pending, remapped_rows.failure, "
          "clocks_event_reasons.active, pcie.link.gen.current, pcie.link.gen.max, "
          "pcie.link.width.current, pcie.link.width.max")
HEALTHY = {"index": "0", "name": "NVIDIA H200", "pci.bus_id": "00000000:00:06.0",
           "ecc.errors.corrected.volatile.total": "0",
           "ecc.errors.uncorrected.volatile.total": "0", "remapped_rows.pending": "No",
           "remapped_rows.failure": "No", "clocks_event_reasons.active": "0x0000000000000001",
           "pcie.link.gen.current": "5", "pcie.link.gen.max": "5",
           "pcie.link.width.current": "16", "pcie.link.width.max": "16"}


def answer(**changes: str) -> str:
    row = dict(HEALTHY)
    row.update({k.replace("__", "."): v for k, v in changes.items()})
    return HEADER + "\n" + ", ".join(row[h.strip()] for h in HEADER.split(",")) + "\n"


def test_the_real_capture_parses_with_the_renamed_header_and_units() -> None:
    (row,) = parse_query(REAL_QUERY)
    assert row["clocks_throttle_reasons.active"] == "0x0000000000000001"
    assert row["power.draw"] == "102.18 W"
    assert row["remapped_rows.pending"] == "No"


def test_the_real_healthy_h200_has_nothing_bad_or_warn() -> None:
    (gpu,) = judge(REAL_QUERY, REAL_DMESG)
    assert [f.verdict for f in gpu.findings if f.verdict in ("bad", "warn")] == []
    # The capture did not ask for the PCIe maxima: unknown, never ok by accident.
    assert {f.field for f in gpu.findings} == {"pcie.link.gen.current",
                                               "pcie.link.width.current"}
    assert gpu.verdict == "unknown"


def test_a_full_healthy_answer_is_ok() -> None:
    (gpu,) = judge(answer(), REAL_DMESG)
    assert gpu.verdict == "ok"
    assert gpu.reason() == "GPU 0 (NVIDIA H200): ok"


@pytest.mark.parametrize(("changes", "field", "words"), [
    ({"ecc__errors__uncorrected__volatile__total": "3"},
     "ecc.errors.uncorrected.volatile.total", "3 uncorrectable"),
    ({"remapped_rows__pending": "Yes"}, "remapped_rows.pending", "pending"),
    ({"remapped_rows__failure": "Yes"}, "remapped_rows.failure", "failed"),
])
def test_each_bad_field_is_named_with_the_provider_action(changes: dict[str, str], field: str,
                                                          words: str) -> None:
    (gpu,) = judge(answer(**changes), "")
    assert gpu.verdict == "bad"
    assert gpu.findings[0].field == field
    assert words in gpu.reason() and "ask the provider for another box" in gpu.reason()


@pytest.mark.parametrize(("changes", "field", "words"), [
    ({"clocks_event_reasons__active": "0x0000000000000040"}, "clocks_event_reasons.active",
     "hardware thermal slowdown"),
    ({"clocks_event_reasons__active": "0x0000000000000004"}, "clocks_event_reasons.active",
     "software power cap"),
    ({"pcie__link__width__current": "4"}, "pcie.link.width.current", "width 4 below"),
])
def test_slowdowns_and_a_narrow_link_warn(changes: dict[str, str], field: str,
                                          words: str) -> None:
    (gpu,) = judge(answer(**changes), "")
    assert gpu.verdict == "warn"
    assert gpu.findings[0].field == field and words in gpu.reason()


def test_correctable_errors_warn_only_when_rising() -> None:
    assert judge(answer(ecc__errors__corrected__volatile__total="7"), "")[0].verdict == "ok"
    rising = judge(answer(ecc__errors__corrected__volatile__total="9"), "",
                   previous=answer(ecc__errors__corrected__volatile__total="7"))
    assert rising[0].verdict == "warn" and "7 -> 9" in rising[0].reason()


@pytest.mark.parametrize("value", ["[N/A]", "N/A", "[Not Supported]", ""])
def test_missing_fields_are_unknown_never_ok(value: str) -> None:
    (gpu,) = judge(answer(remapped_rows__pending=value), "")
    assert gpu.verdict == "unknown"
    assert any(f.field == "remapped_rows.pending" for f in gpu.findings)


def test_an_unreadable_kernel_log_is_unknown() -> None:
    (gpu,) = judge(answer(), None)
    assert gpu.verdict == "unknown" and "dmesg" in gpu.reason()


def test_a_fatal_xid_on_this_gpu_is_bad_and_on_another_gpu_is_not_counted() -> None:
    line = ("[ 812.1] NVRM: Xid (PCI:0000:00:06): 79, pid=1234, name=python3, "
            "GPU has fallen off the bus.\n")
    other = line.replace("00:06", "00:07")
    assert xids(line) == [("0000:00:06", 79)]
    assert 79 in FATAL_XIDS
    assert judge(answer(), REAL_DMESG + line)[0].verdict == "bad"
    assert judge(answer(), REAL_DMESG + other)[0].verdict == "ok"


def test_a_non_fatal_xid_warns() -> None:
    line = "[ 9.0] NVRM: Xid (PCI:0000:00:06): 13, pid=1, Graphics Exception\n"
    (gpu,) = judge(answer(), line)
    assert gpu.verdict == "warn" and "Xid 13" in gpu.reason()


def test_no_answer_is_no_gpus_not_a_crash() -> None:
    assert judge("", "") == []
