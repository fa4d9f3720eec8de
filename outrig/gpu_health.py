"""GPU health: the pure judge of one ``nvidia-smi --query-gpu`` answer and the kernel's Xid lines.

Why a judge of its own: a rented box can carry a card with uncorrectable ECC errors, a pending
or failed row remap, a clock slowdown or a PCIe link trained down, and a two-day run started on
it is corrupted or crawls. The probe on the box only collects text (one ``nvidia-smi`` call with
``--format=csv`` and the ``NVRM: Xid`` lines of ``dmesg`` where readable); everything that
decides lives here, on the workstation, where it is tested over the real capture of a healthy
H200 and over each fault.

Verdicts, worst first: ``bad`` (do not place work here: ask the provider for another box),
``warn`` (the run will work but slower or on a card that is degrading), ``unknown`` (a field
answered ``N/A``, ``[N/A]``, ``Not Supported`` or was not asked: never read as healthy), ``ok``.

Xid numbers in the fatal set follow NVIDIA's Xid table (the "Xid Errors" chapter of NVIDIA's
GPU deployment and management documentation): 48 (double-bit ECC), 63/64 (row-remapping
pending / failure), 74 (NVLink error), 79 (fallen off the bus), 92 (high single-bit ECC rate),
94/95 (contained / uncontained ECC error), plus those the table says need a GPU reset or a
node reboot: 119/120 (GSP timeout / error), 140 (unrecovered ECC), 143 (GPU initialisation
failure) and 154 (GPU recovery action changed: reset or reboot required).
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass, field

# The fields the probe asks for, in the order it asks (``--query-gpu=`` + ",".join(FIELDS)).
FIELDS: tuple[str, ...] = (
    "index", "uuid", "name", "pci.bus_id",
    "ecc.mode.current", "ecc.errors.corrected.volatile.total",
    "ecc.errors.uncorrected.volatile.total", "remapped_rows.pending", "remapped_rows.failure",
    "clocks_throttle_reasons.active", "temperature.gpu", "power.draw", "pstate",
    "pcie.link.gen.current", "pcie.link.gen.max", "pcie.link.width.current",
    "pcie.link.width.max",
)

# nvidia-smi renames some requested fields in its CSV header (seen on driver 580: the header
# says ``clocks_event_reasons.active`` for the requested ``clocks_throttle_reasons.active``)
# and appends units (``power.draw [W]``). Both spellings map to the name asked for.
HEADER_ALIASES = {"clocks_event_reasons.active": "clocks_throttle_reasons.active"}

FATAL_XIDS = frozenset({48, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140, 143, 154})

# Bits of clocks_event_reasons that mean the card is being slowed (NVML's
# nvmlClocksEventReasons): 0x1 GPU idle, 0x2 application clocks and 0x10 sync boost are not.
SLOWDOWN_BITS = {
    0x4: "software power cap",
    0x8: "hardware slowdown",
    0x20: "software thermal slowdown",
    0x40: "hardware thermal slowdown",
    0x80: "hardware power brake slowdown",
}

ORDER = ("ok", "unknown", "warn", "bad")
_MISSING = {"", "n/a", "[n/a]", "not supported", "[not supported]", "unknown error",
            "[unknown error]", "not found"}
_XID = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F:.]+)\): (\d+)")

OTHER_BOX = "ask the provider for another box"


@dataclass(frozen=True)
class Finding:
    """One thing the judge saw: its verdict, the field it read, and what to do."""

    verdict: str
    field: str
    what: str
    fix: str


@dataclass(frozen=True)
class GpuHealth:
    """The verdict on one GPU and the findings behind it (worst first)."""

    index: int
    name: str
    bus_id: str
    findings: tuple[Finding, ...] = field(default=())

    @property
    def verdict(self) -> str:
        """The worst finding's verdict, ``ok`` when nothing was found."""
        return max((f.verdict for f in self.findings), key=ORDER.index, default="ok")

    def reason(self) -> str:
        """One line naming the GPU, each non-ok finding and its fix."""
        bad = [f for f in self.findings if f.verdict != "ok"]
        if not bad:
            return f"GPU {self.index} ({self.name}): ok"
        parts = "; ".join(f"{f.field}: {f.what} ({f.fix})" for f in bad)
        return f"GPU {self.index} ({self.name}): {self.verdict}: {parts}"


def _missing(value: str | None) -> bool:
    return value is None or value.strip().lower() in _MISSING


def parse_query(text: str) -> list[dict[str, str]]:
    """Rows of ``nvidia-smi --query-gpu=... --format=csv`` (with its header) as field → value.

    Header names lose their unit suffix (``power.draw [W]``) and renamed fields get the name
    they were asked by (:data:`HEADER_ALIASES`).
    """
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return []
    rows = list(csv.reader(io.StringIO("\n".join(lines)), skipinitialspace=True))
    header = [HEADER_ALIASES.get(h.split(" [")[0].strip(), h.split(" [")[0].strip())
              for h in rows[0]]
    return [dict(zip(header, (v.strip() for v in row), strict=False)) for row in rows[1:]]


def xids(dmesg: str) -> list[tuple[str, int]]:
    """``(PCI bus id, Xid)`` for each ``NVRM: Xid`` line of the kernel log, in order."""
    return [(m.group(1).lower(), int(m.group(2))) for m in _XID.finditer(dmesg)]


def _same_bus(xid_bus: str, bus_id: str) -> bool:
    """The Xid line says ``0000:00:06`` where nvidia-smi says ``00000000:00:06.0``."""
    tail = bus_id.lower().split(":", 1)[-1].split(".")[0]
    return xid_bus.lower().split(":", 1)[-1].split(".")[0] == tail


def _number(value: str) -> int | None:
    try:
        return int(value, 0) if value.lower().startswith("0x") else int(float(value))
    except ValueError:
        return None


def _ecc(row: dict[str, str], previous: dict[str, str] | None) -> list[Finding]:
    out: list[Finding] = []
    uncorrected = row.get("ecc.errors.uncorrected.volatile.total")
    if _missing(uncorrected):
        out.append(Finding("unknown", "ecc.errors.uncorrected.volatile.total",
                           "not reported (ECC off or an older driver)",
                           "check `nvidia-smi -q -d ECC` on the box"))
    elif (_number(uncorrected or "") or 0) > 0:
        out.append(Finding("bad", "ecc.errors.uncorrected.volatile.total",
                           f"{uncorrected} uncorrectable ECC errors since the driver loaded",
                           OTHER_BOX))
    corrected = _number(row.get("ecc.errors.corrected.volatile.total", "") or "")
    before = _number((previous or {}).get("ecc.errors.corrected.volatile.total", "") or "")
    if corrected is not None and before is not None and corrected > before:
        out.append(Finding("warn", "ecc.errors.corrected.volatile.total",
                           f"correctable ECC errors rising ({before} -> {corrected})",
                           "watch it; if it keeps rising, move the run"))
    return out


def _remap(row: dict[str, str]) -> list[Finding]:
    out: list[Finding] = []
    for key, what in (("remapped_rows.pending", "a row remap is pending (reset needed)"),
                      ("remapped_rows.failure", "a row remap failed")):
        value = row.get(key)
        if _missing(value):
            out.append(Finding("unknown", key, "not reported", "check `nvidia-smi -q -d "
                               "ROW_REMAPPER` on the box"))
        elif (value or "").strip().lower() in ("yes", "1"):
            out.append(Finding("bad", key, what, OTHER_BOX))
    return out


def _clocks(row: dict[str, str]) -> list[Finding]:
    value = row.get("clocks_throttle_reasons.active")
    if _missing(value):
        return [Finding("unknown", "clocks_event_reasons.active", "not reported",
                        "check `nvidia-smi -q -d PERFORMANCE` on the box")]
    bits = _number(value or "")
    if bits is None:
        return [Finding("unknown", "clocks_event_reasons.active", f"unreadable: {value}",
                        "check `nvidia-smi -q -d PERFORMANCE` on the box")]
    slow = [name for bit, name in SLOWDOWN_BITS.items() if bits & bit]
    if slow:
        return [Finding("warn", "clocks_event_reasons.active", ", ".join(slow) + " active",
                        "check cooling and power limits, or ask for another box")]
    return []


def _pcie(row: dict[str, str]) -> list[Finding]:
    out: list[Finding] = []
    for kind in ("gen", "width"):
        now, top = (row.get(f"pcie.link.{kind}.current"), row.get(f"pcie.link.{kind}.max"))
        if _missing(now) or _missing(top):
            out.append(Finding("unknown", f"pcie.link.{kind}.current",
                               "current or maximum not reported",
                               "check `nvidia-smi -q -d PCIE` on the box"))
        elif (_number(now or "") or 0) < (_number(top or "") or 0):
            out.append(Finding("warn", f"pcie.link.{kind}.current",
                               f"PCIe link {kind} {now} below the card's maximum {top}",
                               "an idle card may lower its link generation; under load, "
                               "ask for another box"))
    return out


def judge(query: str, dmesg: str | None, previous: str | None = None) -> list[GpuHealth]:
    """The health of each GPU in ``query`` (the probe's CSV answer).

    ``dmesg`` is the kernel log's text, ``None`` when it could not be read (every GPU then
    gets an ``unknown`` Xid finding: no access is not the same as no error). ``previous`` is
    an earlier answer of the same query, for errors that count as a fault only when rising.
    """
    before = {r.get("index", ""): r for r in parse_query(previous or "")}
    seen = xids(dmesg or "")
    out: list[GpuHealth] = []
    for row in parse_query(query):
        bus = row.get("pci.bus_id", "")
        findings = (_ecc(row, before.get(row.get("index", ""))) + _remap(row) + _clocks(row)
                    + _pcie(row))
        if dmesg is None:
            findings.append(Finding("unknown", "dmesg", "the kernel log could not be read",
                                    "run as a user allowed to read dmesg to see Xid errors"))
        else:
            for xid_bus, number in seen:
                if bus and not _same_bus(xid_bus, bus):
                    continue
                verdict = "bad" if number in FATAL_XIDS else "warn"
                fix = OTHER_BOX if verdict == "bad" else "look it up in NVIDIA's Xid table"
                findings.append(Finding(verdict, "dmesg", f"Xid {number}", fix))
        findings.sort(key=lambda f: ORDER.index(f.verdict), reverse=True)
        index = _number(row.get("index", "")) or 0
        out.append(GpuHealth(index, row.get("name", "?"), bus, tuple(findings)))
    return out
