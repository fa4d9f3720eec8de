"""Plain-text layouts that stay readable in a narrow terminal (80 columns and up).

Boxed tables fold every cell to fit, which breaks a command or a path into fragments spread
over several rows. Here a table row holds only short fields (names, states, pids, numbers);
every long value — a command, a path, a log line, a progress summary — goes on its own lines
under its row. A command is printed whole on one line when it fits, else one option (with its
values) per line, which is also how one would write it by hand; prose is wrapped at spaces. A
single word longer than the terminal (a very long path) is printed whole, never cut.

Text from a process or a box goes through :func:`visible` before a person reads it. These
functions return lines; :class:`outrig.console.Reporter` prints them.
"""

from __future__ import annotations

import math
import re
import shlex
import textwrap
from collections.abc import Iterable, Sequence
from typing import Any

from outrig.journal import utc_text as when
from outrig.progress import Progress, format_duration
from outrig.progress import summary as progress_summary

INDENT = "    "  # where long values under a row start
TREE_LINES = 8  # processes of one record listed under it (the rest are counted)
TORN_LINES = 3  # incomplete checkpoint folders explained under a process (the rest counted)

# Every C0 control but tab and newline, DEL, and every C1 control (0x9b is a one-byte CSI).
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def visible(text: str) -> str:
    """Text from a process (or a box) made harmless for a terminal: control characters shown
    as ``\\x1b``-style escapes instead of acting (window titles, clear screen, OSC 52
    clipboard writes, cursor moves). Tab and newline stay. ``--json`` output keeps exact text,
    so this is applied only where humans read."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def shown(arg: str) -> str:
    """One argument as a shell would need it typed: in double quotes when it holds a single
    quote and nothing a shell expands inside double quotes (``-c "print('hi')"``, as people
    write it), else as :func:`shlex.quote` puts it (``'"'"'`` for each single quote)."""
    quoted = shlex.quote(arg)
    if "'" in arg and not _EXPANDS_IN_DOUBLE.search(arg):
        return f'"{arg}"'
    return quoted


_EXPANDS_IN_DOUBLE = re.compile(r'[$`"\\!\n]')
# Programs whose ``-c`` argument is a program text (shown wrapped at its spaces, under them)
_INLINE_PROGRAM = re.compile(r"(python[0-9.]*|bash|sh|dash|zsh|ksh)$")


def argv_lines(argv: Sequence[str]) -> list[str]:
    """Shell-quoted argv, one option per line with its values (``--flag v1 v2``)."""
    lines: list[str] = []
    for arg in argv:
        if lines and not (arg.startswith("-") and len(arg) > 1 and not arg[1:2].isdigit()):
            lines[-1] += " " + shown(arg)
        else:
            lines.append(shown(arg))
    return lines


def command_lines(argv: Sequence[str], width: int, indent: str = INDENT) -> list[str]:
    """The command on one line when it fits in ``width``, else in the argv-per-line form
    (continuation lines indented four more): never cut inside an argument."""
    whole = " ".join(shown(a) for a in argv)
    if len(indent) + len(whole) <= width:
        return [indent + whole]
    program = _inline_program(argv)
    if program is not None:  # `python3 -u -c PROGRAM ...`: the program wrapped under it
        head = indent + " ".join(shown(a) for a in argv[:program])
        body = [line for text in shown(argv[program]).split("\n")
                for line in wrapped(text, width, indent + "    ", indent + "     ")]
        rest = command_lines(argv[program + 1:], width, indent + "    ") \
            if argv[program + 1:] else []
        return [head, *body, *rest]
    parts = argv_lines(argv)
    out = [indent + parts[0]]
    more = indent + "    "
    for part in parts[1:]:
        if len(more) + len(part) <= width or " " not in part:
            out.append(more + part)
        else:  # `--flag value` too long together: the value goes under its flag
            flag, _, value = part.partition(" ")
            out.extend([more + flag, more + "    " + value])
    return out


def _inline_program(argv: Sequence[str]) -> int | None:
    """The index of a ``-c`` program (``python3 -u -c PROGRAM``, ``bash -c SCRIPT``) that
    holds spaces, when only short options come before it; else None."""
    if not argv or not _INLINE_PROGRAM.match(argv[0].rsplit("/", 1)[-1]):
        return None
    for index, arg in enumerate(argv[1:], 1):
        if arg == "-c":
            found = index + 1
            return found if found < len(argv) and " " in argv[found] else None
        if not (arg.startswith("-") and len(arg) <= 3):
            return None
    return None


def wrapped(text: str, width: int, indent: str = INDENT, later: str | None = None) -> list[str]:
    """Prose (a log line, a summary) wrapped at spaces to ``width``; words are never cut."""
    later = indent if later is None else later
    return textwrap.wrap(text, width=max(width, len(indent) + 20), initial_indent=indent,
                         subsequent_indent=later, break_long_words=False,
                         break_on_hyphens=False, replace_whitespace=False,
                         drop_whitespace=True) or [indent.rstrip()]


def paragraph(text: str, width: int | None, first: str = "", later: str = "  ") -> str:
    """A message (an error, a note, a ``✓`` line) wrapped at spaces to ``width`` (None: left
    as it is), so that the terminal never cuts a word: ``first`` starts it (``error: ``),
    ``later`` each continuation line. Each line of a message of several is wrapped on its
    own; a bullet under the text (``  - problem``) wraps under its own first word (a hanging
    indent); any other line that starts with a space (a command, a table row) is kept as it
    is, and a word longer than the line (a path, a URL) is never cut."""
    if width is None:
        return first + text
    out: list[str] = []
    for number, line in enumerate(text.split("\n")):
        head = first if number == 0 else ""
        bullet = _BULLET.match(line) if number else None
        if bullet:
            out.extend(wrapped(line[bullet.end():], width, indent=bullet.group(0),
                               later=" " * bullet.end()))
        elif number and (not line.strip() or line[:1] in (" ", "\t")):
            out.append(line)
        else:
            out.extend(wrapped(line, width, indent=head, later=later))
    return "\n".join(out)


_BULLET = re.compile(r" +[-•] (?=\S)")


def labelled(label: str, value: str, width: int, indent: str = INDENT) -> list[str]:
    """``label: value`` on one line when it fits, else the label and the value on its own
    line under it (for paths: never split)."""
    line = f"{indent}{label}: {value}"
    if len(line) <= width:
        return [line]
    return [f"{indent}{label}:", f"{indent}    {value}"]


def columns(headers: Sequence[str], rows: Iterable[Sequence[str]],
            indent: str = "  ") -> tuple[str, list[str]]:
    """A header line and row lines with columns aligned (short cells only)."""
    rows = [list(r) for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        padded = (c.ljust(w) for c, w in zip(cells, widths, strict=False))
        return (indent + "  ".join(padded)).rstrip()

    return line(headers), [line(r) for r in rows]


def ranges(indices: Iterable[int]) -> str:
    """``[0, 1, 2, 3, 5]`` as ``0-3,5``."""
    spans: list[list[int]] = []
    for i in sorted(set(indices)):
        if spans and i == spans[-1][1] + 1:
            spans[-1][1] = i
        else:
            spans.append([i, i])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


# ------------------------------------------------------------------------------------ GPUs


def gpu_summary(gpus: Sequence[dict[str, Any]], error: str | None = None) -> str:
    """One line for all GPUs, e.g. ``gpus: 8× NVIDIA H200 141 GiB · 0-3 ours (trainer of
    run X) · 4-5,7 free · 6 held by pid 123 python3 (not ours)``."""
    if not gpus:
        return f"gpus: none ({error})" if error else "gpus: none"
    kinds: dict[str, int] = {}
    for gpu in gpus:
        mem = gpu.get("memory_total_mib")
        kind = visible(str(gpu.get("name") or "GPU")) + (f" {int(mem) // 1024} GiB" if mem
                                                          else "")
        kinds[kind] = kinds.get(kind, 0) + 1
    parts = [", ".join(f"{n}× {k}" for k, n in kinds.items())]
    ours: dict[str, list[int]] = {}
    foreign: dict[str, list[int]] = {}
    free: list[int] = []
    for gpu in gpus:
        index = int(gpu.get("index") or 0)
        holders = gpu.get("holders") or []
        if not holders:
            free.append(index)
        for h in holders:
            if h.get("ours"):
                key = f"ours ({h.get('process')} of run {h.get('run_id')})"
                ours.setdefault(key, []).append(index)
            else:
                comm = f" {visible(str(h.get('comm')))}" if h.get("comm") else ""
                key = f"held by pid {h.get('pid')}{comm} (not ours)"
                foreign.setdefault(key, []).append(index)
    parts += [f"{ranges(i)} {key}" for key, i in ours.items()]
    if free:
        parts.append(f"{ranges(free)} free")
    parts += [f"{ranges(i)} {key}" for key, i in foreign.items()]
    return "gpus: " + " · ".join(parts)


def gpu_summary_lines(gpus: Sequence[dict[str, Any]], width: int,
                      error: str | None = None) -> list[str]:
    """:func:`gpu_summary` wrapped to ``width`` at its `` · `` separators."""
    text = gpu_summary(gpus, error)
    out: list[str] = []
    for part in text.split(" · "):
        if out and len(out[-1]) + 3 + len(part) <= width:
            out[-1] += " · " + part
        else:
            out.append((INDENT + "· " + part) if out else part)
    return out


def audit_gpus(audit: dict[str, Any]) -> list[dict[str, Any]]:
    """A GPU audit (``{gpus, holders}``, as cleanup reports it) in status's shape: each GPU
    with its ``holders`` (``ours``, ``run_id``, ``process``, ``pid``, ``comm``)."""
    out = []
    for gpu in audit.get("gpus") or []:
        held = []
        for h in audit.get("holders") or []:
            if h.get("gpu_index") != gpu.get("index"):
                continue
            owner = h.get("owner") or {}
            held.append({"pid": h.get("pid"), "used_mib": h.get("used_mib"),
                         "comm": h.get("comm"), "ours": bool(owner),
                         "run_id": owner.get("run_id"), "process": owner.get("process")})
        out.append({**gpu, "holders": held})
    return out


def _mib(value: Any) -> str:
    """A memory figure of the table; ``?`` where nvidia-smi gave none it could believe."""
    return "?" if value is None else str(value)


def gpu_table_lines(gpus: Sequence[dict[str, Any]], width: int) -> list[str]:
    """The full GPU table (``--gpus``): one row per GPU, its holders on lines under it;
    ``health`` is the verdict status added (``ok``, ``bad (remapped_rows.pending)``...)."""
    rows = []
    for gpu in gpus:
        util = gpu.get("utilization_pct")
        kinds = sorted({"ours" if h.get("ours") else "NOT OURS"
                        for h in gpu.get("holders") or []}, reverse=True)
        rows.append([str(gpu.get("index")), visible(str(gpu.get("name"))),
                     f"{_mib(gpu.get('memory_used_mib'))}/{_mib(gpu.get('memory_total_mib'))}"
                     " MiB",
                     "-" if util is None else f"{util}%", " + ".join(kinds) or "free",
                     visible(str((gpu.get("health") or {}).get("short") or "-"))])
    header, lines = columns(["gpu", "name", "memory", "util", "held by", "health"], rows)
    out = ["GPUs", header]
    for gpu, line in zip(gpus, lines, strict=False):
        out.append(line)
        for h in gpu.get("holders") or []:
            mem = f" {h['used_mib']} MiB" if h.get("used_mib") is not None else ""
            if h.get("ours"):
                who = f"{h.get('process')} (pid {h.get('pid')}{mem}, run {h.get('run_id')})"
            else:
                who = f"NOT OURS: pid {h.get('pid')} {h.get('comm') or ''}{mem}"
            out += wrapped(visible(who), width)
    return out


# ---------------------------------------------------------------------------------- status


def _state(proc: dict[str, Any]) -> str:
    """The state cell: ``exited (3)``, ``killed (signal 9)``, or ``stopped by cleanup`` for a
    process that outrig itself stopped (the agent's ``stopped_by``), whatever its exit."""
    state = str(proc.get("state"))
    if state == "running" and (proc.get("hung") or {}).get("hung"):
        return "hung"
    if state != "running" and proc.get("stopped_by"):
        return f"stopped by {proc.get('stopped_by')}"
    if state == "exited":
        state += f" ({proc.get('exit_code')})"
    elif state == "killed" and proc.get("signal"):
        state += f" (signal {proc.get('signal')})"
    return state


def _detail(proc: dict[str, Any]) -> str:
    detail = ""
    raw = proc.get("progress")
    if isinstance(raw, dict):
        detail = progress_summary(Progress.from_json(raw))
    server = proc.get("server") or {}
    if server.get("health") is not None or server.get("health_error"):
        health = server.get("health") or f"down ({server.get('health_error')})"
        models = ", ".join(server.get("models") or []) or "?"
        detail = f"/health {health}, serving {models}"
    hung = proc.get("hung") or {}
    signs = [f"{e.get('detail')} ({_confirmed(e)} of {e.get('needed')} confirmations)"
             for e in hung.get("evidence") or [] if isinstance(e, dict)]
    if signs:
        detail = ("; ".join([detail] if detail else []) + ("; " if detail else "")
                  + ("hung: " if hung.get("hung") else "may be hung: ") + "; ".join(signs))
    return detail


def _confirmed(evidence: dict[str, Any]) -> Any:
    """Confirmations seen, shown at most as many as are needed (more change nothing)."""
    seen, needed = evidence.get("confirmations"), evidence.get("needed")
    if isinstance(seen, int) and isinstance(needed, int):
        return min(seen, needed)
    return seen


def status_lines(result: dict[str, Any], width: int, *, gpu_table: bool = False) -> list[str]:
    """``outrig status`` for people: per run a table of short fields; under each process's
    row its progress (or server health) and its last log lines (as many as ``--lines`` asked
    the box for), then the checkpoints and the GPUs (one line, or the table with
    ``gpu_table``)."""
    out: list[str] = []
    for run in result.get("runs") or []:
        if out:
            out.append("")
        out.append(f"run {run.get('run_id')} ({run.get('playbook')}): {run_state(run)}")
        out += wrapped(visible(redeployed_line(run)), width) if run.get("redeployed") else []
        procs = run.get("processes") or []
        rows = []
        for proc in procs:
            ready = proc.get("ready")
            uptime = proc.get("uptime")
            rows.append([str(proc.get("name")), _state(proc), str(proc.get("pid") or "-"),
                         "-" if uptime is None else format_duration(float(uptime)),
                         "-" if ready is None else ("yes" if ready else "no"),
                         ",".join(str(i) for i in proc.get("gpus_held") or []) or "-"])
        header, lines = columns(["process", "state", "pid", "uptime", "ready", "GPUs"], rows)
        out.append(header)
        notes: list[str] = []
        for proc, line in zip(procs, lines, strict=False):
            out.append(line)
            detail = _detail(proc)
            if detail:
                out += wrapped(visible(detail), width)
            for log_line in proc.get("log_tail") or []:
                out += wrapped(visible(str(log_line)), width, INDENT + "| ", INDENT + "|   ")
            out += _tree_lines(proc, width)
            notes += _process_notes(proc, width)
        out += notes
    gpus = result.get("gpus") or []
    if gpus and gpu_table:
        out += ["", *gpu_table_lines(gpus, width)]
    elif gpus or result.get("gpu_error"):
        out += gpu_summary_lines(gpus, width, result.get("gpu_error"))
    return out


def redeployed_line(run: dict[str, Any]) -> str:
    """``moved here from a (run R) with steps=3000, as deployed`` (or the differences from
    run R as it was deployed): see :func:`outrig.ops.status.mark_redeployed`."""
    info = run.get("redeployed") or {}
    params = info.get("params") or {}
    where = f" from {info.get('host')}" if info.get("how") == "moved" else ""
    with_params = (" with " + ", ".join(f"{k}={v}" for k, v in sorted(params.items()))
                   if params else "")
    differences = info.get("differences") or []
    return (f"{info.get('how')} here{where} (run {info.get('run_id')}){with_params}, "
            + ("differences: " + "; ".join(differences) if differences
               else "as deployed"))


def run_state(run: dict[str, Any]) -> str:
    """A run's state for the header line; a run moved to another box says so, and whether
    the box still runs it (status marks it, see :func:`outrig.ops.status.mark_moved_runs`)."""
    moved = run.get("moved_to")
    if not isinstance(moved, dict):
        hung = [str(p.get("name")) for p in run.get("processes") or []
                if isinstance(p, dict) and (p.get("hung") or {}).get("hung")]
        return str(run.get("status")) + (f", hung: {', '.join(hung)}" if hung else "")
    fenced = run.get("fenced")
    if isinstance(fenced, dict):
        return (f"moved to {moved.get('host')} at {when(moved.get('at'))}; fenced at "
                f"{when(fenced.get('at'))} ({run.get('box_status')} here)")
    return (f"moved to {moved.get('host')} at {when(moved.get('at'))}; "
            f"{run.get('box_status')} here, not fenced yet")


def _tree_lines(proc: dict[str, Any], width: int) -> list[str]:
    """The processes of a record besides its leader (vLLM's engine and workers, a trainer's
    ranks), each with the rule that proves it the run's: what cleanup will stop. Shown while
    the leader is gone too, since orphans are then all that is left."""
    out: list[str] = []
    tree = proc.get("tree") or []
    if tree and proc.get("state") != "running":
        out.append(f"{INDENT}{len(tree)} process(es) of {proc.get('name')} outlive it; "
                   "cleanup stops them:")
    nodes = [n for n in tree if isinstance(n, dict)]
    for node in nodes[:TREE_LINES]:
        # about two lines: the command line is shortened, never the proof after it
        head, proof = f"{INDENT}└ {node.get('pid')} ", f" ({node.get('proof')})"
        command = visible(str(node.get("cmdline") or node.get("comm") or "?"))
        room = max(20, width * 2 - len(head) - len(proof) - len(INDENT))
        if len(command) > room:
            command = command[:room - 1].rstrip() + "…"
        out += wrapped(head + command + proof, width, "", INDENT + "    ")
    if len(nodes) > TREE_LINES:
        out.append(f"{INDENT}└ … and {len(nodes) - TREE_LINES} more (outrig status --json)")
    return out


def _process_notes(proc: dict[str, Any], width: int) -> list[str]:
    """Checkpoint lines for one process (paths on their own lines): the newest complete one,
    and why each newer folder is not complete (the agent's verdict: what is missing, or a
    save that started and did not finish)."""
    name = str(proc.get("name"))
    out: list[str] = []
    checkpoint = proc.get("checkpoint")
    if not isinstance(checkpoint, dict):
        return out
    if checkpoint.get("path"):
        out += labelled(f"{name}: newest complete checkpoint ({checkpoint.get('count')} "
                        "saved)", visible(str(checkpoint["path"])), width, "  ")
    else:
        out += labelled(f"{name}: no complete checkpoint yet in",
                        visible(str(checkpoint.get("save_path"))), width, "  ")
    torn = [c for c in checkpoint.get("incomplete") or [] if isinstance(c, dict)]
    for entry in torn[:TORN_LINES]:
        out += wrapped(visible(f"{name}: checkpoint {entry.get('name')} is not complete: "
                               f"{entry.get('why')}"), width, "  ", INDENT)
    if len(torn) > TORN_LINES:
        out.append(f"  {name}: … and {len(torn) - TORN_LINES} more incomplete (outrig status "
                   "--json)")
    return out


# ------------------------------------------------------------------------------------ plan


def plan_lines(plan: Any, width: int, *, full: bool = False) -> list[str]:
    """``outrig plan`` (and deploy's plan) for people: each process's short fields in a
    row, its readiness and whole command under it (and its env with ``full``)."""
    mode = " (test mode)" if plan.test_mode else ""
    out = [f"plan: {plan.playbook}{mode} on {plan.host}"]
    out += labelled("run", plan.run_id, width, "  ")
    out += labelled("workdir", plan.workdir, width, "  ")
    rows, procs = [], []
    for index, name in enumerate(plan.order, 1):
        proc = plan.processes.get(name)
        if proc is None:
            continue
        gpus = ",".join(map(str, proc.gpus)) or "-"
        if proc.parallel:
            gpus += f" (TP{proc.parallel[0]}×DP{proc.parallel[1]})"
        rows.append([str(index), name, gpus, ",".join(proc.after) or "-",
                     f"TERM, {proc.stop_grace:g}s, KILL"])
        procs.append(proc)
    header, lines = columns(["#", "process", "gpus", "after", "stop"], rows)
    out.append(header)
    for proc, line in zip(procs, lines, strict=False):
        out.append(line)
        ready = proc.ready.describe() if proc.ready else "up 2 s after launch"
        out += wrapped(f"ready: {ready}", width)
        out += command_lines(proc.argv, width)
        if full and proc.env:
            pairs = [f"{k}={shown(v)}" for k, v in sorted(proc.env.items())]
            joined = INDENT + "env: " + " ".join(pairs)
            out += [joined] if len(joined) <= width else \
                [INDENT + "env:"] + [INDENT + "    " + p for p in pairs]
    if plan.files:
        out += wrapped("files pushed: " + ", ".join(remote for remote, _ in plan.files),
                       width, "", INDENT)
    if plan.secrets:
        out += wrapped(f"secrets passed over the channel: {', '.join(plan.secrets)} "
                       "(values hidden)", width, "", INDENT)
    for note in plan.notes:
        out += wrapped(f"note: {note}", width, "", INDENT)
    return out


# --------------------------------------------------------------------------------- fan-out


FANOUT_STATES = ("ok", "failed", "no answer")  # a fan-out row's state column


def fanout_header(hosts: Sequence[str]) -> tuple[str, int]:
    """The header of a fan-out table and the width of its host column, known from the
    selection before any host answers (rows are printed as each host finishes)."""
    host_width = max([len("host"), *(len(h) for h in hosts)])
    state_width = max(len(s) for s in FANOUT_STATES)
    return f"  {'host':<{host_width}}  {'state':<{state_width}}  summary", host_width


def fanout_row(host: str, state: str, summary: str, warnings: Sequence[str],
               host_width: int, width: int) -> list[str]:
    """One host's row (host, state, summary), the summary under the row when the row would
    not fit in ``width``; then each of that host's warnings, wrapped, under it."""
    bare = f"  {host:<{host_width}}  {state:<{max(len(s) for s in FANOUT_STATES)}}"
    line = f"{bare}  {summary}".rstrip()
    out = [line] if len(line) <= width else [bare.rstrip(), *wrapped(summary, width)]
    for warning in warnings:
        out += wrapped(f"warning: {warning}", width, INDENT, INDENT + "  ")
    return out


def fanout_failures(failures: Sequence[tuple[str, str]], total: int, width: int) -> list[str]:
    """After the table: each failed host with its whole reason, wrapped."""
    if not failures:
        return []
    out = ["", f"{len(failures)} of {total} hosts failed:"]
    for host, reason in failures:
        out += wrapped(f"{host}: {reason}", width, "  ", INDENT)
    return out


def fmt(value: float | None, digits: int = 2) -> str:
    """A number for the terminal; ``-`` for none."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}"
