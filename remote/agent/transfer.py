"""Transfers: manifests, the frame stream (send and receive), the stage mark and the keys a
peer box uses; one framing for every route."""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import time
from typing import IO, Any, Dict, List, Optional, Protocol

from .constants import JSONDict
from .events import AgentError, Emitter, bad_request
from .layout import fsync_dir, read_json, write_atomic, write_json_atomic
from .validation import Request, get_bool, get_name, get_opt_str, get_str

#
# Moving model weights, data and checkpoints between boxes and the workstation. One framing
# for every route (box → workstation → box, box → box over ssh, workstation → box):
#   b"C" + {"path", "offset", "length"} + b"\n" + <length raw bytes>   a chunk of a file
#   b"D" + {"path", "size", "sha256"} + b"\n"                          that file is complete
#   b"Z" + {} + b"\n"                                                  end of stream
# Receivers write ``<path>.outrig-part`` at the chunk's offset and rename it only after the
# size and sha256 match, so a cut transfer resumes from the part file's size and a half
# written file is never mistaken for a complete one. Manifests (path, size, sha256) decide
# what is already present; sha256 sums are cached per (size, mtime) in .outrig-manifest.json.

TRANSFER_CHUNK = 1 << 20
PART_SUFFIX = ".outrig-part"
MANIFEST_CACHE = ".outrig-manifest.json"
STAGED_MARK = ".outrig-staged.json"
KEY_TAG = "outrig-transfer:"
CHECKPOINT_FILES = (
    "config.json",
    "model.safetensors",
    "optimizer_state_dict.pt",
    "scheduler_state_dict.pt",
    "training_state.json",
)


def _safe_rel(root: str, rel: str) -> str:
    """``root/rel``, refusing absolute paths and ``..`` (a manifest must stay in its root)."""
    if not rel or rel.startswith("/") or "\0" in rel or ".." in rel.split("/"):
        raise bad_request(f"path {rel!r} must be relative and stay inside {root}")
    return os.path.join(root, rel)


def _is_internal(name: str) -> bool:
    return name.startswith(".outrig-") or name.endswith(PART_SUFFIX)


def sha256_file(path: str, prefix_only: Optional[int] = None) -> str:
    import hashlib

    digest = hashlib.sha256()
    left = prefix_only
    with open(path, "rb") as f:
        while True:
            want = TRANSFER_CHUNK if left is None else min(TRANSFER_CHUNK, left)
            if want == 0:
                break
            block = f.read(want)
            if not block:
                break
            digest.update(block)
            if left is not None:
                left -= len(block)
    return digest.hexdigest()


def walk_files(root: str) -> List[str]:
    """Relative paths of regular files under root (symlinks to files followed), sorted."""
    out: List[str] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if not _is_internal(d))
        for name in filenames:
            if _is_internal(name):
                continue
            full = os.path.join(dirpath, name)
            if os.path.isfile(full):
                out.append(os.path.relpath(full, root))
    return sorted(out)


class EventSink(Protocol):
    """What the transfer code needs of an :class:`Emitter`; the workstation, which runs this
    code for its own side of a transfer, passes its own (outrig/transfer.py ``Events``)."""

    def emit(self, event: str, **fields: Any) -> None:
        """One event."""


class ByteSink(Protocol):
    """Where frames are written: the agent's stdout, or the workstation's adapter."""

    def write(self, data: bytes) -> Any:
        """Bytes out."""

    def flush(self) -> Any:
        """Pass on what was written."""


def dir_manifest(root: str, want_hash: bool, out: EventSink,
                 cache_path: Optional[str] = None) -> JSONDict:
    """path → {size, sha256?}; sha256 sums come from the cache when size and mtime match.
    The cache is ``root/.outrig-manifest.json`` unless ``cache_path`` names another file (the
    workstation keeps its own out of the user's folders)."""
    if cache_path is None:
        cache_path = os.path.join(root, MANIFEST_CACHE)
    else:
        with contextlib.suppress(OSError):
            os.makedirs(os.path.dirname(cache_path), exist_ok=True)
    try:
        cache = read_json(cache_path)
        if not isinstance(cache, dict):
            cache = {}
    except (OSError, ValueError):
        cache = {}
    files: Dict[str, JSONDict] = {}
    partial: Dict[str, int] = {}
    changed = False
    hashed_bytes = 0
    last_beat = time.monotonic()
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            if name.endswith(PART_SUFFIX):
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, root)[: -len(PART_SUFFIX)]
                with contextlib.suppress(OSError):
                    partial[rel] = os.path.getsize(full)
    for rel in walk_files(root):
        st = os.stat(os.path.join(root, rel))
        # mtime travels so the copy keeps it: a checkpoint's completeness is judged by which
        # of its files was written last (checkpoint_verdict), and a copy must not change that
        entry: JSONDict = {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
        if want_hash:
            cached = cache.get(rel)
            if (isinstance(cached, dict) and cached.get("size") == st.st_size
                    and cached.get("mtime_ns") == st.st_mtime_ns and cached.get("sha256")):
                entry["sha256"] = cached["sha256"]
            else:
                entry["sha256"] = sha256_file(os.path.join(root, rel))
                cache[rel] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns,
                              "sha256": entry["sha256"]}
                changed = True
                hashed_bytes += st.st_size
                if time.monotonic() - last_beat > 2:
                    last_beat = time.monotonic()
                    out.emit("progress", what=f"hashing {root}", bytes=hashed_bytes)
        files[rel] = entry
    if changed:
        with contextlib.suppress(OSError):
            write_json_atomic(cache_path, cache)
    return {"files": files, "partial": partial}


def staged_record(root: str) -> Optional[JSONDict]:
    """The stage mark, if every file it lists is still there with the same size and mtime."""
    try:
        mark = read_json(os.path.join(root, STAGED_MARK))
    except (OSError, ValueError):
        return None
    if not isinstance(mark, dict) or not isinstance(mark.get("files"), dict):
        return None
    for rel, info in mark["files"].items():
        try:
            st = os.stat(os.path.join(root, rel))
        except OSError:
            return None
        if st.st_size != info.get("size") or st.st_mtime_ns != info.get("mtime_ns"):
            return None
    return mark


def op_manifest(req: Request, out: Emitter) -> JSONDict:
    """What is at each path: files with size (and sha256), partial files, the stage mark."""
    raw = req.raw
    items = raw.get("items")
    if not isinstance(items, list):
        raise bad_request("items: must be a list of {name, path}")
    want_hash = get_bool(raw, "hash", "", True)
    results = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise bad_request(f"items[{i}]: must be an object")
        name = get_str(item, "name", f"items[{i}].")
        path = os.path.expanduser(get_str(item, "path", f"items[{i}]."))
        entry: JSONDict = {"name": name, "path": path, "exists": os.path.isdir(path)}
        if entry["exists"]:
            mark = staged_record(path)
            entry["staged"] = mark is not None
            entry["source"] = mark.get("source") if mark else None
            if mark is not None and not get_bool(item, "verify", "", False):
                entry["files"] = {rel: {"size": info["size"], "sha256": info.get("sha256")}
                                  for rel, info in mark["files"].items()}
                entry["partial"] = {}
            else:
                entry.update(dir_manifest(path, want_hash, out))
            entry["total_bytes"] = sum(f["size"] for f in entry["files"].values())
        elif os.path.exists(path):
            raise AgentError("workdir", f"{path} exists but is not a directory")
        results.append(entry)
    return {"items": results}


def write_frame(stream: ByteSink, tag: bytes, header: JSONDict, data: bytes = b"") -> None:
    stream.write(tag + json.dumps(header).encode("ascii") + b"\n")
    if data:
        stream.write(data)


def send_frames(root: str, files: List[JSONDict], stream: ByteSink) -> int:
    """Write the frames for ``files`` ({path, offset}) under ``root``; return bytes sent."""
    import hashlib

    sent = 0
    for entry in files:
        rel = entry["path"]
        offset = int(entry.get("offset") or 0)
        full = _safe_rel(root, rel)
        size = os.path.getsize(full)
        if offset > size:
            offset = 0
        digest = hashlib.sha256()
        with open(full, "rb") as f:
            if offset:
                left = offset
                while left:  # the prefix the receiver already has: hash it, don't send it
                    block = f.read(min(TRANSFER_CHUNK, left))
                    if not block:
                        break
                    digest.update(block)
                    left -= len(block)
            position = offset
            while True:
                block = f.read(TRANSFER_CHUNK)
                if not block:
                    break
                digest.update(block)
                write_frame(stream, b"C", {"path": rel, "offset": position,
                                           "length": len(block)}, block)
                position += len(block)
                sent += len(block)
        write_frame(stream, b"D", {"path": rel, "size": position, "sha256": digest.hexdigest()})
        stream.flush()
    write_frame(stream, b"Z", {})
    stream.flush()
    return sent


def op_send_files(req: Request, out: Emitter) -> JSONDict:
    """Stream frames of the requested files to stdout (the JSON result follows the Z frame)."""
    raw = req.raw
    root = os.path.expanduser(get_str(raw, "root", ""))
    files = raw.get("files")
    if not isinstance(files, list) or not all(isinstance(f, dict) for f in files):
        raise bad_request("files: must be a list of {path, offset}")
    for f in files:
        _safe_rel(root, str(f.get("path") or ""))
        if not os.path.isfile(os.path.join(root, str(f["path"]))):
            raise AgentError("not_found", f"{os.path.join(root, str(f['path']))} does not exist "
                             "(the source changed since its manifest was read)")
    sent = send_frames(root, files, out.stream)
    return {"bytes": sent}


class FrameReceiver:
    """Consumes frames into ``root`` (part files, verify, rename); reports progress."""

    def __init__(self, root: str, expect: Dict[str, JSONDict], out: EventSink) -> None:
        self.root = root
        self.expect = expect
        self.out = out
        self.bytes = 0
        self.files: List[str] = []
        self.started = time.monotonic()
        self.last_beat = self.started
        self.total = sum(int(e.get("size") or 0) for e in expect.values())

    def _part(self, rel: str) -> str:
        full = _safe_rel(self.root, rel)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        return full + PART_SUFFIX

    def consume(self, reader: IO[bytes]) -> JSONDict:
        while True:
            line = reader.readline()
            if not line:
                raise AgentError("transfer", "the stream ended before its end mark (the "
                                 "sender died or the link was cut); run the same command "
                                 "again to resume from what was received")
            tag, body = line[:1], line[1:]
            if tag == b"{":  # the sender's own result line: it failed before finishing
                try:
                    err = json.loads(line).get("error") or {}
                except ValueError:
                    err = {}
                raise AgentError("transfer", f"the sender failed: {err.get('message', line)}")
            header = json.loads(body)
            if tag == b"C":
                self._chunk(reader, header)
            elif tag == b"D":
                self._done(header)
            elif tag == b"Z":
                return {"files": self.files, "bytes": self.bytes,
                        "seconds": round(time.monotonic() - self.started, 3)}
            else:
                raise AgentError("transfer", f"unexpected frame {tag!r} in the stream")

    def _chunk(self, reader: IO[bytes], header: JSONDict) -> None:
        rel, offset, length = header["path"], int(header["offset"]), int(header["length"])
        if rel not in self.expect:
            raise AgentError("transfer", f"the sender sent {rel}, which was not asked for")
        part = self._part(rel)
        fd = os.open(part, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.lseek(fd, offset, os.SEEK_SET)
            left = length
            while left:
                block = reader.read(min(left, TRANSFER_CHUNK))
                if not block:
                    raise AgentError("transfer", "the stream was cut in the middle of a chunk; "
                                     "run the same command again to resume")
                view = memoryview(block)
                while view:
                    n = os.write(fd, view)
                    view = view[n:]
                left -= len(block)
                self.bytes += len(block)
        finally:
            os.close(fd)
        now = time.monotonic()
        if now - self.last_beat >= 1.0:
            self.last_beat = now
            rate = self.bytes / max(1e-6, now - self.started)
            self.out.emit("progress", what=rel, bytes=self.bytes, total=self.total,
                          rate=round(rate))

    def _done(self, header: JSONDict) -> None:
        rel = header["path"]
        part = self._part(rel)
        final = _safe_rel(self.root, rel)
        want = self.expect.get(rel) or {}
        if not os.path.exists(part):  # an empty file sends no chunk
            open(part, "wb").close()
        size = os.path.getsize(part)
        digest = sha256_file(part)
        if size != header["size"] or digest != header["sha256"] or (
                want.get("sha256") and want["sha256"] != digest) or (
                want.get("size") is not None and want["size"] != size):
            os.unlink(part)
            raise AgentError("transfer", f"{rel}: received {size} bytes with sha256 {digest[:12]}"
                             f"…, expected {want.get('size', header['size'])} bytes "
                             f"{str(want.get('sha256') or header['sha256'])[:12]}…; the part "
                             "file was removed, run the command again")
        keep_mtime(part, want)
        with open(part, "rb") as f:
            os.fsync(f.fileno())
        os.replace(part, final)
        fsync_dir(os.path.dirname(final))
        self.files.append(rel)
        self.out.emit("file", path=rel, size=size)


def keep_mtime(path: str, info: JSONDict) -> None:
    """Give a received file its source's mtime (as ``cp -p`` would), when the source sent it."""
    mtime = info.get("mtime_ns")
    if isinstance(mtime, int) and mtime > 0:
        os.utime(path, ns=(mtime, mtime))


def mark_staged(root: str, expect: Dict[str, JSONDict], source: Optional[str]) -> None:
    """Record that ``root`` holds exactly ``expect``, verified: a re-run is one exec.

    Files that were already present (same size and sha256, so not sent) get the source's
    mtime here too, so the folder's file times match the source's as a whole."""
    files: Dict[str, JSONDict] = {}
    cache: Dict[str, JSONDict] = {}
    for rel, info in expect.items():
        keep_mtime(os.path.join(root, rel), info)
        st = os.stat(os.path.join(root, rel))
        files[rel] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns,
                      "sha256": info.get("sha256")}
        if info.get("sha256"):
            cache[rel] = dict(files[rel])
    write_json_atomic(os.path.join(root, STAGED_MARK),
                      {"source": source, "files": files, "staged_at": round(time.time(), 3)})
    with contextlib.suppress(OSError, ValueError):
        old = read_json(os.path.join(root, MANIFEST_CACHE))
        if isinstance(old, dict):
            old.update(cache)
            cache = old
    with contextlib.suppress(OSError):
        write_json_atomic(os.path.join(root, MANIFEST_CACHE), cache)


def _expect(raw: JSONDict) -> Dict[str, JSONDict]:
    expect = raw.get("expect")
    if not isinstance(expect, dict) or not all(isinstance(v, dict) for v in expect.values()):
        raise bad_request("expect: must map relative paths to {size, sha256}")
    return expect


def _finish_receive(root: str, raw: JSONDict, expect: Dict[str, JSONDict]) -> None:
    if get_bool(raw, "mark_staged", "", False):
        missing = [rel for rel in expect if not os.path.isfile(os.path.join(root, rel))]
        if missing:
            raise AgentError("transfer", f"{len(missing)} file(s) still missing in {root}, "
                             f"e.g. {missing[0]}")
        mark_staged(root, expect, get_opt_str(raw, "source", ""))


def op_recv_files(req: Request, out: Emitter) -> JSONDict:
    """Receive frames on stdin into ``root``; the request itself came in argv."""
    raw = req.raw
    root = os.path.expanduser(get_str(raw, "root", ""))
    expect = _expect(raw)
    try:
        os.makedirs(root, exist_ok=True)
    except OSError as exc:
        raise AgentError("workdir", f"cannot create {root}: {exc.strerror}") from None
    receiver = FrameReceiver(root, expect, out)
    result = receiver.consume(sys.stdin.buffer) if expect else {"files": [], "bytes": 0}
    _finish_receive(root, raw, expect)
    return result


def _authorized_keys() -> str:
    """The file this box's sshd reads keys from: ~/.ssh/authorized_keys unless the host's
    env names another with OUTRIG_AUTHORIZED_KEYS (an sshd with its own AuthorizedKeysFile)."""
    return os.path.expanduser(os.environ.get("OUTRIG_AUTHORIZED_KEYS")
                              or "~/.ssh/authorized_keys")


def op_authorize_key(req: Request, out: Emitter) -> JSONDict:
    """Let a peer box pull files from this one: a restricted, tagged authorized_keys line."""
    raw = req.raw
    key = get_str(raw, "public_key", "").strip()
    tag = get_name(raw, "tag", "")
    if not re.match(r"^(ssh-ed25519|ecdsa-sha2-nistp256|ssh-rsa) [A-Za-z0-9+/=]+$",
                    " ".join(key.split()[:2])):
        raise bad_request("public_key: not an OpenSSH public key line")
    path = _authorized_keys()
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    _purge_keys(path, None, max_age=6 * 3600)
    line = f"restrict {' '.join(key.split()[:2])} {KEY_TAG}{tag}\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "a", encoding="ascii") as f:
        f.write(line)
    return {"path": path, "tag": tag}


def _purge_keys(path: str, tag: Optional[str], max_age: Optional[float] = None) -> int:
    """Remove our tagged lines (one tag, or any older than ``max_age``); keep everything else."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.readlines()
    except OSError:
        return 0
    keep: List[str] = []
    removed = 0
    for line in lines:
        match = re.search(re.escape(KEY_TAG) + r"(\S+)\s*$", line)
        drop = False
        if match:
            if tag is not None and match.group(1) == tag:
                drop = True
            elif max_age is not None:
                stamp = match.group(1).split("-", 1)[0]
                drop = stamp.isdigit() and time.time() - int(stamp) > max_age
        if drop:
            removed += 1
        else:
            keep.append(line)
    if removed:
        write_atomic(path, "".join(keep).encode("utf-8"), 0o600)
    return removed


def op_revoke_key(req: Request, out: Emitter) -> JSONDict:
    tag = get_name(req.raw, "tag", "")
    return {"removed": _purge_keys(_authorized_keys(), tag)}


def op_mark_staged(req: Request, out: Emitter) -> JSONDict:
    """After a parallel copy: check every expected file is in place, then write the mark."""
    raw = req.raw
    root = os.path.expanduser(get_str(raw, "root", ""))
    expect = _expect(raw)
    wrong = []
    for rel, info in expect.items():
        full = _safe_rel(root, rel)
        if not os.path.isfile(full) or os.path.getsize(full) != info.get("size"):
            wrong.append(rel)
    if wrong:
        raise AgentError("transfer", f"{len(wrong)} file(s) missing or of the wrong size in "
                         f"{root}, e.g. {wrong[0]}; run the command again")
    mark_staged(root, expect, get_opt_str(raw, "source", ""))
    return {"root": root, "files": len(expect)}
