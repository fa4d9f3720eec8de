"""A full-disk workdir for tests: a small tmpfs mounted on a folder, then filled to ENOSPC.

Why a real filesystem: what breaks on a full box is every ``write()`` the agent does failing
with ``ENOSPC`` (run.json, exit files, the lock note, a probe file); only a filesystem that is
really full gives that errno at those calls. ``RLIMIT_FSIZE`` is no substitute: it fails
writes with ``EFBIG`` (and SIGXFSZ), and only beyond a size, not at file creation.

Mounting needs ``CAP_SYS_ADMIN`` (root in a container often lacks it) or an unprivileged user
namespace, which would hide the agent's processes from the test. So :func:`mount_small_fs`
raises :class:`FullDiskUnavailable` saying why when the machine does not allow it, and the
test fixture skips with that reason. Only the mount this module made is ever unmounted.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

from outrig.errors import OutrigError


class FullDiskUnavailable(OutrigError, RuntimeError):
    """This machine cannot mount a small filesystem for the full-disk tests (the reason)."""


def _tool(name: str) -> str:
    """The path of mount(8) or umount(8), or FullDiskUnavailable."""
    for folder in ("/usr/bin", "/bin", "/usr/sbin", "/sbin"):
        candidate = os.path.join(folder, name)
        if os.access(candidate, os.X_OK):
            return candidate
    raise FullDiskUnavailable(f"{name}(8) is not installed, so no small tmpfs can be mounted")


@contextlib.contextmanager
def mount_small_fs(path: Path, size_kib: int = 1024) -> Iterator[Path]:
    """Mount a ``size_kib`` tmpfs on ``path`` (created if missing) and unmount it afterwards."""
    if os.geteuid() != 0:
        raise FullDiskUnavailable("mounting a tmpfs needs root (with CAP_SYS_ADMIN); "
                                  f"this runs as uid {os.geteuid()}")
    mount = _tool("mount")
    umount = _tool("umount")
    path.mkdir(parents=True, exist_ok=True)
    argv = [mount, "-t", "tmpfs", "-o", f"size={int(size_kib)}k,mode=0755", "tmpfs", str(path)]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise FullDiskUnavailable(
            f"cannot mount a tmpfs on {path} (no CAP_SYS_ADMIN in this container?): "
            f"{(done.stderr or done.stdout).strip()}")
    try:
        yield path
    finally:
        subprocess.run([umount, "-l", str(path)],
                       capture_output=True, check=False)


def fill(path: Path, name: str = "filler.bin") -> int:
    """Write zeros into ``path/name`` until the filesystem says ENOSPC; return bytes written.

    Raises AssertionError when the filesystem never fills (it would not be the test it claims).
    """
    written = 0
    block = b"\0" * 4096
    fd = os.open(path / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        while True:
            try:
                written += os.write(fd, block)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                break
            if written > 1 << 30:
                raise AssertionError(f"{path} took 1 GiB without filling up: not a small fs")
    finally:
        os.close(fd)
    return written


def is_full(path: Path) -> bool:
    """Does a one-byte write under ``path`` fail with ENOSPC right now?"""
    probe = path / ".fulldisk-probe"
    try:
        with open(probe, "wb") as f:
            f.write(b"x")
    except OSError as exc:
        return exc.errno == errno.ENOSPC
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()
    return False
