"""The bundle's top-level ``__main__.py`` (see bundle.py): start the agent.

Run as ``python -S <cache folder>`` it imports the package beside it. Run by the bootstrap
with the bundle in memory (globals ``BUNDLE``, ``CACHE``, ``DIGEST``), it first unpacks the
bundle into the cache folder and ``execv``'s the short form; when that folder cannot be made
(no workdir yet: the agent never creates it as a side effect; a full or read-only disk) the
agent runs from the zip in memory through :class:`MemoryImporter`. Stdlib only, Python 3.8.
"""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType
from typing import Any, Dict, Optional

PACKAGE = "outrig_agent"
MARK = "BUNDLE"
STALE_TMP_S = 600.0  # an unpacking folder this old was left by a killed agent


class MemoryImporter:
    """Finds and loads the bundle's modules from the zip's bytes (and serves ``get_data`` for
    the non-module files the agent reads, such as wrap.py)."""

    def __init__(self, files: Dict[str, bytes], root: str) -> None:
        self.files = files
        self.root = root

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        """A spec for ``outrig_agent`` and its modules; None for everything else."""
        import importlib.util

        rel = name.replace(".", "/")
        package = rel + "/__init__.py" in self.files
        if not package and rel + ".py" not in self.files:
            return None
        origin = os.path.join(self.root, rel + ("/__init__.py" if package else ".py"))
        spec = importlib.util.spec_from_loader(name, self,  # type: ignore[arg-type]
                                               origin=origin, is_package=package)
        if spec is not None:
            spec.has_location = True
            if package:
                spec.submodule_search_locations = [os.path.join(self.root, rel)]
        return spec

    def create_module(self, spec: Any) -> Optional[ModuleType]:
        """The default module object."""
        return None

    def exec_module(self, module: ModuleType) -> None:
        """Compile the module's source from the zip and run it in the module."""
        path = module.__spec__.origin if module.__spec__ is not None else None
        assert path is not None
        exec(compile(self.get_data(path), path, "exec"), module.__dict__)

    def get_data(self, path: str) -> bytes:
        """A file of the bundle by its (virtual) path."""
        rel = os.path.relpath(path, self.root)
        if rel not in self.files:
            raise OSError(f"{path} is not in the agent bundle")
        return self.files[rel]


def mark_valid(folder: str, digest: str) -> bool:
    """The folder holds this bundle unpacked: its mark names the digest and every listed file
    has its size (the bootstrap checks the same before it execs the folder)."""
    try:
        with open(os.path.join(folder, MARK), "rb") as f:
            words = f.read().split()
        return bool(words) and words[0] == digest.encode() and all(
            os.path.getsize(os.path.join(folder, words[i].decode())) == int(words[i + 1])
            for i in range(1, len(words), 2))
    except (OSError, ValueError, IndexError):
        return False


def remove_stale(parent: str, digest: str) -> None:
    """Unpacking folders of this digest left by an agent that was killed mid-way."""
    import shutil
    import time

    now = time.time()
    for name in os.listdir(parent):
        if not name.startswith(digest + ".tmp."):
            continue
        full = os.path.join(parent, name)
        try:
            if now - os.stat(full).st_mtime > STALE_TMP_S:
                shutil.rmtree(full, ignore_errors=True)
        except OSError:
            pass


def unpack(bundle: bytes, cache: str, digest: str) -> bool:
    """Unpack the bundle into ``cache`` (a sibling temporary folder renamed into place, so a
    cut unpack never looks complete; a corrupt or partial folder there is replaced). False
    when it cannot be done, so the caller runs from memory."""
    import hashlib
    import io
    import shutil
    import zipfile

    if not cache or hashlib.sha256(bundle).hexdigest()[:20] != digest:
        return False  # no workdir given, or not the bundle the name promises
    if mark_valid(cache, digest):
        return True
    parent = os.path.dirname(cache)
    workdir = os.path.dirname(os.path.dirname(parent))
    if not os.path.isdir(workdir):
        return False  # the agent never creates the workdir just by being started
    tmp = f"{cache}.tmp.{os.getpid()}"
    try:
        os.makedirs(parent, exist_ok=True)
        remove_stale(parent, digest)
        shutil.rmtree(tmp, ignore_errors=True)
        with zipfile.ZipFile(io.BytesIO(bundle)) as zf:
            zf.extractall(tmp)
            sizes = [f"{i.filename} {i.file_size}" for i in zf.infolist()
                     if not i.is_dir()]
        compile_folder(tmp, cache)
        with open(os.path.join(tmp, MARK), "w") as f:
            f.write(" ".join([digest, *sizes]) + "\n")
        try:
            os.rename(tmp, cache)
        except OSError:
            if not mark_valid(cache, digest):  # a stale or corrupt folder, not a racing agent
                shutil.rmtree(cache, ignore_errors=True)
                os.rename(tmp, cache)
        return True
    except OSError:
        return False
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def compile_folder(folder: str, shown_as: str) -> None:
    """Write this interpreter's ``__pycache__`` for the unpacked package (named as it will be
    after the rename), so every later start loads compiled code: Python would not write it
    itself where ``PYTHONDONTWRITEBYTECODE`` is set, as many container images do. Best effort:
    without it the agent still runs, compiling in memory."""
    import compileall

    try:
        compileall.compile_dir(folder, ddir=shown_as, quiet=2, workers=1)
    except Exception:  # an unwritable folder or an odd interpreter: run anyway
        pass


def run_in_memory(bundle: bytes) -> None:
    """Import the package from the zip in memory and run the agent in this process."""
    import io
    import zipfile

    with zipfile.ZipFile(io.BytesIO(bundle)) as zf:
        files = {name: zf.read(name) for name in zf.namelist() if not name.endswith("/")}
    sys.meta_path.insert(0, MemoryImporter(files, "<outrig-agent>"))
    importlib.import_module(PACKAGE + ".__main__").main()


def start(g: Dict[str, Any]) -> None:
    """Unpack and exec the cached folder, or run from memory, or (run from the folder)
    import the package beside this file."""
    bundle = g.get("BUNDLE")
    if not isinstance(bundle, bytes):
        here = os.path.dirname(os.path.abspath(str(g.get("__file__") or ".")))
        tag = getattr(sys.implementation, "cache_tag", None)
        if tag and not os.path.exists(os.path.join(here, PACKAGE, "__pycache__",
                                                   f"__init__.{tag}.pyc")):
            compile_folder(here, here)  # another interpreter than the one that unpacked it
        importlib.import_module(PACKAGE + ".__main__").main()
        return
    cache, digest = str(g.get("CACHE") or ""), str(g.get("DIGEST") or "")
    if sys.executable and unpack(bundle, cache, digest):
        sys.stdout.flush()
        os.execv(sys.executable, [sys.executable, "-S", cache])
    run_in_memory(bundle)


if __name__ == "__main__":
    start(globals())
