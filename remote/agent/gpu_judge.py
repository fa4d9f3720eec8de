"""The judge of GPU health: what nvidia-smi's health fields and the kernel's Xid lines say
about each GPU, as ``ok``, ``warn``, ``bad`` or ``unknown``, each finding with the field it
read and what to do.

Why here, in the agent's package: the same judge decides on both sides. The box's deploy
refuses a ``bad`` GPU before it takes the workdir lock (nothing stopped, written or started,
no extra round trip), and the workstation judges the very same raw fields for ``check``,
``status``, ``plan``, ``watch`` and ``migrate`` (``outrig/agent_code.py`` imports this module,
``outrig/hosts/gpu_health.py`` shows its verdicts and remembers counters between looks). Pure: no
I/O, no clock; stdlib only, Python 3.8.

The rules, and why each:

* ``bad``: uncorrectable volatile ECC errors since the driver loaded (the memory returned
  wrong data once already), a pending row remap (the repair only takes effect after a GPU
  reset), a remap failure (the memory cannot be repaired), a pending page retirement (the
  pre-Ampere form of the same), and an Xid in :data:`FATAL_XIDS` since boot.
* ``warn``: correctable volatile errors higher than at the last look (the rising count that
  comes before uncorrectable ones), hardware or thermal slowdown or power braking active, a
  slow P-state while the GPU is not idle, a PCIe link narrower (or, while busy, slower) than
  the card's maximum, ECC switched off.
* ``unknown``: a field nvidia-smi answers ``N/A`` / ``[Not Supported]`` for, a driver that
  does not know the field, a kernel log this user may not read, and a value that lies: one
  that is not a finite number in the field's range (:data:`RANGES`: ``nan``, ``inf``,
  ``1e400``, a negative error count), named with the field it came in. Never ``ok`` by
  accident.

The Xid set follows NVIDIA's Xid catalog (https://docs.nvidia.com/deploy/xid-errors/
analyzing-xid-catalog.html, "Resolution Bucket (Immediate Action)"): the Xids whose action is
a GPU reset, a reboot or a call to support rather than restarting the application. 13, 31,
43 and 45 (an application's own faults and the driver's cleanup after them) are listed as
seen but do not make a GPU ``bad``: they are what a crashing program leaves, not a sick card.
"""

from __future__ import annotations

import math
import re
from typing import Any, Dict, List, Optional, Tuple

JSONDict = Dict[str, Any]

OK, UNKNOWN, WARN, BAD = "ok", "unknown", "warn", "bad"
RANK = {OK: 0, UNKNOWN: 1, WARN: 2, BAD: 3}  # the worst finding is the GPU's verdict

# The fields the agent adds to its one ``--query-gpu`` (remote/agent/gpus.py), in order.
# ``clocks_throttle_reasons.active`` is the name every driver knows; drivers since 535 answer
# it under its new header ``clocks_event_reasons.active`` (the H200 capture shows both).
HEALTH_FIELDS: Tuple[str, ...] = (
    "ecc.mode.current",
    "ecc.errors.corrected.volatile.total",
    "ecc.errors.uncorrected.volatile.total",
    "retired_pages.pending",
    "remapped_rows.pending",
    "remapped_rows.failure",
    "clocks_throttle_reasons.active",
    "temperature.gpu",
    "power.draw",
    "pstate",
    "pcie.link.gen.current",
    "pcie.link.gen.max",
    "pcie.link.width.current",
    "pcie.link.width.max",
)

ANOTHER_BOX = "ask the provider for another box"
RESET = ("reset the GPU (as root, nothing running on it: nvidia-smi -r -i {i}) or reboot the "
         "box, then check again; on a rented box: " + ANOTHER_BOX)

# Xid → (what it is, what to do). The catalog's reset / reboot / support buckets.
FATAL_XIDS: Dict[int, Tuple[str, str]] = {
    46: ("GPU stopped processing", RESET),
    48: ("double-bit (uncorrectable) ECC error", RESET),
    61: ("internal micro-controller breakpoint", RESET),
    62: ("internal micro-controller halt", RESET),
    63: ("ECC page retirement or row remapping pending", RESET),
    64: ("ECC page retirement or row remapping failed", ANOTHER_BOX + " (the memory cannot "
         "be repaired)"),
    74: ("NVLink error", RESET),
    79: ("GPU has fallen off the bus", "reboot the box; on a rented box: " + ANOTHER_BOX),
    92: ("high single-bit ECC error rate", RESET),
    94: ("contained ECC error (an application's memory was corrupted)", RESET),
    95: ("uncontained ECC error", RESET),
    119: ("GSP RPC timeout", RESET),
    120: ("GSP error", RESET),
    123: ("SPI PMU RPC write failure", RESET),
    136: ("GPU initialization failure (memory training)", RESET),
    140: ("unrecovered ECC error", RESET),
    143: ("GPU initialization failure", RESET),
    150: ("GSP firmware fault", RESET),
    154: ("GPU recovery action changed (reset or reboot required)", RESET),
}

# clocks_throttle_reasons.active bits (nvml.h, nvmlClocksEventReason*): the slowdowns that
# mean a sick or badly cooled card. SW power cap (0x4) is the card holding its own power
# limit under full load: normal, not judged. Idle (0x1) marks an idle GPU.
IDLE_BIT = 0x1
SLOWDOWNS: Tuple[Tuple[int, str], ...] = (
    (0x8, "HW slowdown"),
    (0x20, "SW thermal slowdown"),
    (0x40, "HW thermal slowdown"),
    (0x80, "HW power brake slowdown"),
)
SLOW_PSTATE = 5  # P5 and slower while not idle: the card is not clocking up

XID_RE = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f]+):([0-9A-Fa-f]+):([0-9A-Fa-f]+)"
                    r"(?:\.[0-9A-Fa-f])?\): (\d+)")
STAMP_RE = re.compile(r"^\[\s*(\d+\.\d+)\]")


# The range each numeric field's value must fall in to be believed (inclusive). A count of
# errors is a whole number from 0; the clocks reasons are a 64-bit mask; a PCIe link is x1
# to x32 (x64 leaves room) and gen 1 to 6 (10 leaves room).
RANGES: Dict[str, Tuple[float, float]] = {
    "ecc.errors.corrected.volatile.total": (0, 2.0 ** 63),
    "ecc.errors.uncorrected.volatile.total": (0, 2.0 ** 63),
    "clocks_throttle_reasons.active": (0, 2.0 ** 64 - 1),
    "pcie.link.gen.current": (1, 10),
    "pcie.link.gen.max": (1, 10),
    "pcie.link.width.current": (1, 64),
    "pcie.link.width.max": (1, 64),
}


def missing(value: Any) -> bool:
    """Whether nvidia-smi gave no value: ``N/A``, ``[N/A]``, ``[Not Supported]``, ``Unknown
    Error`` or nothing at all (an older driver, or a field this GPU does not have)."""
    if value is None:
        return True
    text = str(value).strip()
    return (not text or "N/A" in text or text.startswith("[")
            or text.lower() in ("not supported", "unknown error", "unknown"))


def number(value: Any) -> Optional[float]:
    """A numeric field (units such as ``W`` or ``C`` dropped), or None when missing."""
    if missing(value):
        return None
    text = str(value).strip().split()[0]
    try:
        found = float(int(text, 16)) if text.lower().startswith("0x") else float(text)
    except (ValueError, OverflowError):
        return None
    return found if math.isfinite(found) else None


def reading(fields: JSONDict, field: str) -> Tuple[Optional[float], Optional[str]]:
    """A numeric health field as ``(value, None)``; ``(None, None)`` when nvidia-smi gave
    none (``N/A``); ``(None, why)`` when it gave one that lies: not a number, not finite
    (``nan``, ``inf``, ``1e400``), not whole where it counts, or outside :data:`RANGES`."""
    raw = fields.get(field)
    if missing(raw):
        return None, None
    value = number(raw)
    low, high = RANGES.get(field, (-math.inf, math.inf))
    if value is not None and low <= value <= high and value == int(value):
        return value, None
    shown = str(raw).strip()[:40]
    span = f"from {low:g}" + (f" to {high:g}" if high < 2 ** 53 else "")
    return None, (f"nvidia-smi answered {shown!r} for {field}, which is not a finite whole "
                  f"number {span}: the value cannot be believed")


def _lie(check: str, field: str, fields: JSONDict, why: str) -> JSONDict:
    """The ``unknown`` finding of a field whose value lies (:func:`reading`)."""
    return finding(check, UNKNOWN, field, str(fields.get(field)).strip()[:40], why,
                   "look at nvidia-smi -q on the box; a driver answering this needs a "
                   "reboot or the provider's attention")


def yes_no(value: Any) -> Optional[bool]:
    """``Yes``/``No`` → True/False; anything else (``[N/A]``) → None."""
    if missing(value):
        return None
    text = str(value).strip().lower()
    return True if text == "yes" else False if text == "no" else None


def parse_xid_lines(lines: List[str]) -> List[JSONDict]:
    """``NVRM: Xid (PCI:0000:3b:00): 79, pid=..., GPU has fallen off the bus.`` lines as
    ``{xid, pci: (domain, bus, device), seconds, text}`` (``seconds`` since boot, from
    dmesg's stamp; None without one). Lines that do not parse are skipped."""
    out: List[JSONDict] = []
    for line in lines:
        match = XID_RE.search(line)
        if match is None:
            continue
        stamp = STAMP_RE.match(line.strip())
        out.append({"xid": int(match.group(4)),
                    "pci": (int(match.group(1), 16), int(match.group(2), 16),
                            int(match.group(3), 16)),
                    "seconds": float(stamp.group(1)) if stamp else None,
                    "text": line[match.start():].strip()[:200]})
    return out


def bus_key(bus_id: Any) -> Optional[Tuple[int, int, int]]:
    """``00000000:3B:00.0`` (nvidia-smi's pci.bus_id) → (domain, bus, device), the key an
    Xid line names its GPU by (``PCI:0000:3b:00``)."""
    parts = str(bus_id or "").split(":")
    if len(parts) != 3:
        return None
    try:
        return int(parts[0], 16), int(parts[1], 16), int(parts[2].split(".")[0], 16)
    except ValueError:
        return None


def finding(check: str, verdict: str, field: str, value: Any, why: str,
            fix: Optional[str] = None) -> JSONDict:
    return {"check": check, "verdict": verdict, "field": field,
            "value": None if value is None else str(value), "why": why, "fix": fix}


def judge_gpu(gpu: JSONDict, xid: Optional[JSONDict] = None,
              previous: Optional[JSONDict] = None,
              health_error: Optional[str] = None,
              box_buses: Optional[List[Any]] = None) -> JSONDict:
    """One GPU's verdict and findings.

    ``gpu``: a GPU of the ``facts`` event (its ``health`` holds the raw :data:`HEALTH_FIELDS`
    strings); ``xid``: the facts' ``xid`` (``{lines, error}``: the kernel log's Xid lines, or
    why they could not be read); ``previous``: what the last look saw of this GPU
    (``{uuid, corrected}``), for a rising correctable count; ``health_error``: why the box
    gave no health fields at all (an old driver); ``box_buses``: every GPU's
    ``pci_bus_id`` on the box (an Xid naming another of them is not this GPU's)."""
    index = gpu.get("index")
    raw = gpu.get("health")
    fields: JSONDict = raw if isinstance(raw, dict) else {}
    found: List[JSONDict] = []
    if not fields:
        why = health_error or "the box sent no health fields (an agent or driver without them)"
        found.append(finding("health", UNKNOWN, "nvidia-smi --query-gpu", None, why,
                             "update the NVIDIA driver to read ECC, remapping and clocks"))
    else:
        found += _ecc(fields, index, previous, gpu.get("uuid"))
        found += _memory_repair(fields, index)
        found += _clocks(fields)
        found += _pcie(fields)
    lies = gpu.get("bad_values")
    for field, raw in sorted(lies.items()) if isinstance(lies, dict) else []:
        found.append(finding("inventory", UNKNOWN, str(field), str(raw)[:40],
                             f"nvidia-smi answered {str(raw)[:40]!r} for {field}, which is "
                             "not a finite whole number from 0: the value cannot be believed",
                             "look at nvidia-smi -q on the box; a driver answering this "
                             "needs a reboot or the provider's attention"))
    found += _xids(gpu, xid, index, box_buses or [])
    verdict = max((f["verdict"] for f in found), key=lambda v: RANK[v], default=OK)
    corrected = reading(fields, "ecc.errors.corrected.volatile.total")[0]
    return {"index": index, "uuid": gpu.get("uuid"), "verdict": verdict, "findings": found,
            "corrected": None if corrected is None else int(corrected)}


def judge_facts(facts: JSONDict, previous: Optional[Dict[str, JSONDict]] = None
                ) -> List[JSONDict]:
    """Every GPU of a ``facts`` event judged (``previous``: uuid → the last look's
    :func:`judge_gpu` answer)."""
    xid = facts.get("xid") if isinstance(facts.get("xid"), dict) else None
    before = previous or {}
    gpus = [g for g in facts.get("gpus") or [] if isinstance(g, dict)]
    buses = [g.get("pci_bus_id") for g in gpus]
    return [judge_gpu(g, xid, before.get(str(g.get("uuid"))), facts.get("gpu_health_error"),
                      buses) for g in gpus]


def _ecc(fields: JSONDict, index: Any, previous: Optional[JSONDict],
         uuid: Any) -> List[JSONDict]:
    out: List[JSONDict] = []
    mode = fields.get("ecc.mode.current")
    unc_field = "ecc.errors.uncorrected.volatile.total"
    unc, lie = reading(fields, unc_field)
    if lie is not None:
        out.append(_lie("ecc", unc_field, fields, lie))
    elif unc is None:
        if str(mode or "").strip().lower() == "disabled":
            out.append(finding("ecc", WARN, "ecc.mode.current", mode,
                               "ECC is off: memory errors go undetected",
                               f"turn ECC on (as root: nvidia-smi -e 1 -i {index}, then "
                               "reboot) or ask for a box with ECC on"))
        else:
            out.append(finding("ecc", UNKNOWN, unc_field, fields.get(unc_field),
                               "the driver does not report uncorrectable ECC errors"))
    elif unc > 0:
        out.append(finding("ecc", BAD, unc_field, int(unc),
                           f"{int(unc)} uncorrectable ECC error(s) since the driver loaded: "
                           "results computed on this GPU may be corrupt",
                           RESET.format(i=index)))
    else:
        out.append(finding("ecc", OK, unc_field, 0, "no uncorrectable ECC errors"))
    cor_field = "ecc.errors.corrected.volatile.total"
    cor, lie = reading(fields, cor_field)
    if lie is not None:
        out.append(_lie("ecc_corrected", cor_field, fields, lie))
    before = previous.get("corrected") if previous and previous.get("uuid") in (None, uuid) \
        else None
    if cor is not None and isinstance(before, (int, float)) and cor > before:
        out.append(finding("ecc_corrected", WARN, cor_field, int(cor),
                           f"correctable ECC errors rising ({int(before)} → {int(cor)} since "
                           "the last look): the memory is wearing; uncorrectable errors often "
                           "follow", "watch it; for a long run, " + ANOTHER_BOX))
    return out


def _memory_repair(fields: JSONDict, index: Any) -> List[JSONDict]:
    """Row remapping (Ampere and newer) or page retirement (older GPUs): one of the two
    answers; a GPU where both are N/A cannot say whether its memory needs a repair."""
    out: List[JSONDict] = []
    pending = yes_no(fields.get("remapped_rows.pending"))
    failure = yes_no(fields.get("remapped_rows.failure"))
    retired = yes_no(fields.get("retired_pages.pending"))
    if failure:
        out.append(finding("remap", BAD, "remapped_rows.failure", "Yes",
                           "a row remap failed: this GPU's memory cannot be repaired",
                           ANOTHER_BOX + " (the provider must replace the GPU)"))
    if pending:
        out.append(finding("remap", BAD, "remapped_rows.pending", "Yes",
                           "a row remap is pending: the repaired memory is used only after a "
                           "GPU reset", RESET.format(i=index)))
    if retired:
        out.append(finding("retired_pages", BAD, "retired_pages.pending", "Yes",
                           "a page retirement is pending: the bad memory is still in use until "
                           "the GPU is reset", RESET.format(i=index)))
    if out:
        return out
    if pending is False and failure is False:
        return [finding("remap", OK, "remapped_rows.pending", "No", "no row remap pending")]
    if retired is False:
        return [finding("retired_pages", OK, "retired_pages.pending", "No",
                        "no page retirement pending")]
    return [finding("remap", UNKNOWN, "remapped_rows.pending",
                    fields.get("remapped_rows.pending"),
                    "neither row remapping nor page retirement is reported")]


def _clocks(fields: JSONDict) -> List[JSONDict]:
    field = "clocks_throttle_reasons.active"
    reasons, lie = reading(fields, field)
    if lie is not None:
        return [_lie("clocks", field, fields, lie)]
    if reasons is None:
        return [finding("clocks", UNKNOWN, field, fields.get(field),
                        "the driver does not report why the clocks are held down")]
    bits = int(reasons)
    out: List[JSONDict] = []
    active = [name for bit, name in SLOWDOWNS if bits & bit]
    if active:
        temp = fields.get("temperature.gpu")
        out.append(finding("clocks", WARN, field, fields.get(field),
                           f"{', '.join(active)} active (GPU at {temp} C, "
                           f"{fields.get('power.draw')} W): it runs below its clocks",
                           "ask the provider to check the cooling and power of the box, or "
                           + ANOTHER_BOX))
    pstate = str(fields.get("pstate") or "").strip()
    level = int(pstate[1:]) if pstate[:1] == "P" and pstate[1:].isdigit() else None
    if level is not None and level >= SLOW_PSTATE and not bits & IDLE_BIT:
        out.append(finding("pstate", WARN, "pstate", pstate,
                           f"busy in P-state {pstate} (P0 is full speed): the card is not "
                           "clocking up", "ask the provider to check the box's power "
                           "settings, or " + ANOTHER_BOX))
    if not out:
        out.append(finding("clocks", OK, field, fields.get(field),
                           "no thermal or power slowdown"))
    return out


def _pcie(fields: JSONDict) -> List[JSONDict]:
    read = {f: reading(fields, f) for f in ("pcie.link.width.current", "pcie.link.width.max",
                                             "pcie.link.gen.current", "pcie.link.gen.max")}
    lies = [_lie("pcie", f, fields, why) for f, (_, why) in read.items() if why is not None]
    if lies:
        return lies
    width, wmax = read["pcie.link.width.current"][0], read["pcie.link.width.max"][0]
    gen, gmax = read["pcie.link.gen.current"][0], read["pcie.link.gen.max"][0]
    if width is None:
        return [finding("pcie", UNKNOWN, "pcie.link.width.current",
                        fields.get("pcie.link.width.current"),
                        "the driver does not report the PCIe link width")]
    if wmax is None:
        return [finding("pcie", UNKNOWN, "pcie.link.width.max", fields.get("pcie.link.width.max"),
                        f"PCIe x{int(width)}, but the card's widest link is not reported")]
    if width < wmax:
        return [finding("pcie", WARN, "pcie.link.width.current", int(width),
                        f"PCIe link trained to x{int(width)} of the card's x{int(wmax)}: "
                        "copies between host and GPU run at a fraction of their speed",
                        "ask the provider to reseat the card, or " + ANOTHER_BOX)]
    idle = (int(reading(fields, "clocks_throttle_reasons.active")[0] or 0) & IDLE_BIT) != 0
    if gen is not None and gmax is not None and gen < gmax and not idle:
        # an idle GPU lowers its link generation to save power: judged only while busy
        return [finding("pcie", WARN, "pcie.link.gen.current", int(gen),
                        f"busy on a PCIe gen {int(gen)} link; the card does gen {int(gmax)}",
                        "ask the provider to check the slot's PCIe settings, or "
                        + ANOTHER_BOX)]
    return [finding("pcie", OK, "pcie.link.width.current", int(width),
                    f"PCIe x{int(width)}" + (f" gen {int(gen)}" if gen is not None else ""))]


def _xids(gpu: JSONDict, xid: Optional[JSONDict], index: Any,
          box_buses: List[Any]) -> List[JSONDict]:
    """Fatal Xids of this GPU since boot (by PCI address; a line naming no GPU of the box
    counts for every GPU: it cannot be told apart)."""
    if xid is None:
        return [finding("xid", UNKNOWN, "dmesg", None, "the box did not read the kernel log")]
    if xid.get("lines") is None:
        return [finding("xid", UNKNOWN, "dmesg", None,
                        f"the kernel log cannot be read ({xid.get('error') or 'no dmesg'}), "
                        "so Xid errors cannot be seen",
                        "run outrig as a user who may read it (root, or the adm group, or "
                        "sysctl kernel.dmesg_restrict=0) to see Xid errors")]
    mine = bus_key(gpu.get("pci_bus_id"))
    known = {key for key in (bus_key(b) for b in box_buses) if key is not None}
    fatal: List[JSONDict] = []
    seen: List[int] = []
    for event in parse_xid_lines([str(x) for x in xid.get("lines") or []]):
        pci = event["pci"]
        if pci != mine and pci in known:
            continue
        if event["xid"] in FATAL_XIDS:
            fatal.append(event)
        else:
            seen.append(event["xid"])
    if fatal:
        last = fatal[-1]
        what, fix = FATAL_XIDS[last["xid"]]
        when = f" {last['seconds']:.0f} s after boot" if last["seconds"] is not None else ""
        codes = sorted({e["xid"] for e in fatal})
        return [finding("xid", BAD, "dmesg", last["text"],
                        f"Xid {', '.join(str(c) for c in codes)} in the kernel log (the last: "
                        f"{last['xid']}, {what}{when})", fix.format(i=index))]
    note = (f"; not fatal: Xid {', '.join(str(c) for c in sorted(set(seen)))} (an "
            "application's faults)") if seen else ""
    return [finding("xid", OK, "dmesg", None, "no fatal Xid since boot" + note)]


def worst(verdicts: List[JSONDict]) -> str:
    """The worst verdict of several GPUs (``ok`` for none)."""
    return max((v["verdict"] for v in verdicts), key=lambda v: RANK[v], default=OK)


def summary(verdict: JSONDict) -> str:
    """``GPU 3 bad: remapped_rows.pending = Yes: a row remap is pending ...; fix: ...``:
    the worst findings of one GPU, for messages."""
    worst_rank = RANK[verdict["verdict"]]
    parts = []
    for f in verdict["findings"]:
        if RANK[f["verdict"]] != worst_rank or f["verdict"] == OK:
            continue
        value = f" = {f['value']}" if f.get("value") is not None and f["check"] != "xid" else ""
        parts.append(f"{f['field']}{value}: {f['why']}" + (f"; fix: {f['fix']}" if f.get("fix")
                                                            else ""))
    head = f"GPU {verdict['index']} {verdict['verdict']}"
    return head + (": " + " | ".join(parts) if parts else "")


def refusals(verdicts: List[JSONDict], needed: List[int]) -> List[JSONDict]:
    """The ``bad`` GPUs among ``needed`` (what deploy refuses to place a process on)."""
    return [v for v in verdicts if v["verdict"] == BAD and v.get("index") in needed]
