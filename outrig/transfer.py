"""Moving files: between a box and the workstation, or from box to box.

Every route speaks the agent's frame format (remote/agent/transfer.py):
a sender writes chunk frames, a receiver writes ``<file>.outrig-part`` at each chunk's offset
and renames only after size and sha256 match. The workstation side reuses the agent's own
sender and receiver code (the agent module is imported locally), so there is one
implementation of the format.

Routes, fastest first (the choice is :mod:`outrig.ops.stage`'s):
- ``peer``: the destination box pulls straight from the source box over ssh with a throwaway
  key, so 50 GB never cross the workstation's slow link;
- ``relay``: the workstation pumps one box's stream into the other's stdin;
- ``push`` / ``pull``: between the workstation's disk and a box.

Throughput: one SSH channel is capped by its window (2 MiB / RTT ≈ 8.7 MB/s at 240 ms), so
files are spread over several streams (channels) that run side by side on one connection.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from outrig.agent.client import AgentCall, raise_for_result
from outrig.agent_code import AgentError as BoxError
from outrig.agent_code import transfer as box_transfer
from outrig.errors import LinkLost, RemoteError
from outrig.inventory import Host
from outrig.journal import make_private_dir
from outrig.transport import Transport

Manifest = dict[str, dict[str, Any]]  # relative path → {"size", "sha256"}
ProgressFn = Callable[[dict[str, Any]], None]
RECEIVE_WINDOW = 16 << 20
STREAMS = 4  # the default number of parallel streams, everywhere (stage, cli, copy)


class BoxSession(Protocol):
    """What a transfer needs of a session (:class:`outrig.session.HostSession`): the box,
    its connector, and the request body of an op. Named here so that this module, below the
    ops, does not import them."""

    host: Host
    transport: Transport

    def request(self, op: str, **fields: Any) -> dict[str, Any]: ...


RESUME_HINT = "Run the same command again to resume from what was received."


@dataclass
class Plan:
    """What to copy: files with the offset to resume from, and what they must be."""

    files: list[dict[str, Any]] = field(default_factory=list)  # {"path", "offset"}
    expect: Manifest = field(default_factory=dict)
    skipped: int = 0

    @property
    def bytes(self) -> int:
        return sum(int(self.expect[f["path"]]["size"]) - int(f["offset"]) for f in self.files)


def diff(source: Manifest, dest: Manifest, partial: dict[str, int]) -> Plan:
    """Files of ``source`` that ``dest`` lacks or holds differently; resume from part files."""
    plan = Plan(expect=dict(source))
    for rel, info in sorted(source.items()):
        have = dest.get(rel)
        if have and have.get("size") == info.get("size") and (
                not info.get("sha256") or have.get("sha256") == info.get("sha256")):
            plan.skipped += 1
            continue
        offset = partial.get(rel, 0)
        if offset > int(info.get("size") or 0):
            offset = 0
        plan.files.append({"path": rel, "offset": offset})
    return plan


def split(files: list[dict[str, Any]], expect: Manifest,
          streams: int) -> list[list[dict[str, Any]]]:
    """Balance files over ``streams`` groups by bytes (largest first, into the lightest)."""
    groups: list[list[dict[str, Any]]] = [[] for _ in range(max(1, streams))]
    loads = [0] * len(groups)
    for entry in sorted(files, key=lambda f: -int(expect[f["path"]]["size"])):
        index = loads.index(min(loads))
        groups[index].append(entry)
        loads[index] += int(expect[entry["path"]]["size"]) - int(entry["offset"])
    return [g for g in groups if g]


# ----------------------------------------------------------------------------------- sources


class _Sink:
    """File-like adapter so the agent's ``send_frames`` can write into any byte consumer."""

    def __init__(self, write: Callable[[bytes], None]) -> None:
        self.write = write

    def flush(self) -> None:
        """Frames are passed on as they are written."""


Source = Callable[[list[dict[str, Any]], Callable[[bytes], None]], None]


def box_source(session: BoxSession, root: str) -> Source:
    """Frames of ``root``'s files, produced by the box's agent (``send_files``)."""

    def pump(files: list[dict[str, Any]], write: Callable[[bytes], None]) -> None:
        call = AgentCall(session.transport)
        request = session.request("send_files", root=root, files=files)
        channel = call.start(request, window_size=RECEIVE_WINDOW)
        try:
            reader = call.reader(channel, after=RESUME_HINT)
            for data in reader.chunks():
                write(data)
            if reader.link_dropped():  # EOF without an exit status: not the sender's end
                raise LinkLost(f"the link to {session.host.label()} dropped while files "
                               f"were coming. {RESUME_HINT}", phase="stream",
                               request_sent=True)
        finally:
            channel.close()

    return pump


def local_source(root: Path) -> Source:
    """Frames of files on the workstation's disk (the agent's sender, run here)."""

    def pump(files: list[dict[str, Any]], write: Callable[[bytes], None]) -> None:
        box_transfer.send_frames(str(root), files, _Sink(write))

    return pump


# ---------------------------------------------------------------------------- destinations


class Events:
    """Duck-types the agent's Emitter for agent code run here: events go to ``progress``
    (``None``: dropped)."""

    def __init__(self, progress: ProgressFn | None) -> None:
        self.progress = progress

    def emit(self, event: str, **fields: Any) -> None:
        if self.progress is not None:
            self.progress({"event": event, **fields})


def _run_stream(source: Source, files: list[dict[str, Any]],
                sink: Callable[[bytes], None], done: Callable[[], None]) -> Callable[[], None]:
    """Run ``source`` into ``sink`` on a thread; returns a join() that re-raises its error."""
    error: list[BaseException] = []

    def work() -> None:
        try:
            source(files, sink)
        except BaseException as exc:  # reported by join() on the caller's thread
            error.append(exc)
        finally:
            done()

    thread = threading.Thread(target=work, daemon=True)
    thread.start()

    def join() -> None:
        thread.join()
        if error:
            raise error[0]

    return join


def to_box(source: Source, files: list[dict[str, Any]], expect: Manifest,
           progress: ProgressFn | None, *, session: BoxSession, root: str) -> dict[str, Any]:
    """One stream into the box's ``recv_files``; the workstation pumps ``source`` into it."""
    call = AgentCall(session.transport)
    subset = {f["path"]: expect[f["path"]] for f in files}
    channel = call.start(session.request("recv_files", root=root, expect=subset))
    broken: list[BaseException] = []

    def write(data: bytes) -> None:
        if broken:
            raise broken[0]
        channel.write(data)

    join = _run_stream(source, files, write, channel.close_input)
    try:
        result = call.reader(channel, after=RESUME_HINT).result(progress, call.events)
    except BaseException as exc:
        broken.append(exc)
        channel.close()
        raise
    finally:
        try:
            join()
        except (OSError, EOFError):
            pass  # the receiver's own error (raised above or below) is the one that matters
    channel.close()
    return raise_for_result(result, where=f"receiving on {session.host.label()}")


def to_local(source: Source, files: list[dict[str, Any]], expect: Manifest,
             progress: ProgressFn | None, *, root: Path) -> dict[str, Any]:
    """One stream into a folder on the workstation (the agent's receiver, run here): the
    checkpoint mirror, in the private state folder (made 0700 if new)."""
    make_private_dir(root)
    read_fd, write_fd = os.pipe()
    subset = {f["path"]: expect[f["path"]] for f in files}

    def write(data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(write_fd, view):]

    join = _run_stream(source, files, write, lambda: os.close(write_fd))
    with os.fdopen(read_fd, "rb") as reader:
        try:
            result: dict[str, Any] = box_transfer.FrameReceiver(str(root), subset,
                                                         Events(progress)).consume(reader)
        except BoxError as exc:
            lost = _lost_link(join)
            if lost is not None:  # the true cause of a stream that ended early
                raise lost from None
            raise RemoteError(f"receiving into {root}: {exc.message}", kind=exc.kind) from None
        finally:
            try:
                join()
            except OSError:
                pass
    return result


def _lost_link(join: Callable[[], None]) -> LinkLost | None:
    """The source's LinkLost, if a lost link is why its stream ended early."""
    try:
        join()
    except LinkLost as exc:
        return exc
    except OSError:
        return None
    return None


def copy(source: Source, plan: Plan, dest: Callable[..., dict[str, Any]],
         progress: ProgressFn | None, streams: int = STREAMS) -> dict[str, Any]:
    """Run the plan over up to ``streams`` parallel streams; first error wins."""
    groups = split(plan.files, plan.expect, streams)
    results: list[dict[str, Any]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def one(group: list[dict[str, Any]]) -> None:
        try:
            outcome = dest(source, group, plan.expect, progress)
            with lock:
                results.append(outcome)
        except BaseException as exc:
            with lock:
                errors.append(exc)

    threads = [threading.Thread(target=one, args=(g,), daemon=True) for g in groups]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    moved = sum(int(r.get("bytes") or 0) for r in results)
    return {"files": sum(len(r.get("files") or []) for r in results), "bytes": moved,
            "seconds": round(time.monotonic() - started, 3), "streams": len(groups)}


def human_bytes(count: float) -> str:
    """``1.5 GB``, ``340 kB``: transfer sizes for people."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(count) < 1000 or unit == "TB":
            return f"{count:,.0f} {unit}" if unit == "B" else f"{count:,.1f} {unit}"
        count /= 1000
    return f"{count:,.1f} TB"


class Meter:
    """Adds up progress events from parallel streams into one rate and ETA line."""

    def __init__(self, total: int, show: Callable[[str], None], label: str) -> None:
        self.total = total
        self.show = show
        self.label = label
        self.started = time.monotonic()
        self.per_stream: dict[int, int] = {}
        self.done_files = 0
        self.lock = threading.Lock()

    def __call__(self, event: dict[str, Any]) -> None:
        with self.lock:
            if event.get("event") == "file":
                self.done_files += 1
            elif event.get("event") == "progress" and "bytes" in event:
                self.per_stream[threading.get_ident()] = int(event["bytes"])
            else:
                return
            moved = sum(self.per_stream.values())
            elapsed = max(1e-6, time.monotonic() - self.started)
            rate = moved / elapsed
            eta = (self.total - moved) / rate if rate > 0 and self.total > moved else 0
            self.show(f"{self.label}: {human_bytes(moved)} of {human_bytes(self.total)} at "
                      f"{human_bytes(rate)}/s, ETA {eta:,.0f}s, {self.done_files} file(s) done")
