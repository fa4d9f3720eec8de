"""Patch a module right after its body runs: the import machinery both CPU shims use
(cpu_shim/ for the trainer, vllm_cpu_shim/ for the real vLLM server).

Each shim is a ``sitecustomize`` whose folder is put alone on its process's ``PYTHONPATH``
(tests/rehearsal/harness.py), so this file is not importable there: each shim loads it from
its path (``_load_patching`` in each sitecustomize.py), and how the shims are put on
``PYTHONPATH`` stays as it is.

A finder first on ``sys.meta_path`` wraps the normal loader of the modules named in the
shim's patches, so the patch runs right after the module body, before anything that
imported the module (or a class of it) by name can hold the original.

Standard library only, Python 3.8 syntax: it runs in the real tools' interpreters.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from types import ModuleType
from typing import Any, Callable, Dict, Optional, Sequence

Patch = Callable[[ModuleType], None]


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, patch: Patch,
                 when: Callable[[Patch], bool]) -> None:
        self.inner = inner
        self.patch = patch
        self.when = when

    def __getattr__(self, name: str) -> Any:  # get_code, get_source, is_package, ...
        return getattr(self.inner, name)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Optional[ModuleType]:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        if self.when(self.patch):
            self.patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    """Hands out the normal spec of a module in ``patches``, its loader wrapped."""

    def __init__(self, patches: Dict[str, Patch], when: Callable[[Patch], bool]) -> None:
        self.patches = patches
        self.when = when

    def find_spec(self, fullname: str, path: Optional[Sequence[str]],
                  target: Optional[ModuleType] = None) -> Optional[importlib.machinery.ModuleSpec]:
        patch = self.patches.get(fullname)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _PatchingLoader(spec.loader, patch, self.when)
                return spec
        return None


def install(patches: Dict[str, Patch], when: Callable[[Patch], bool] = lambda patch: True
            ) -> None:
    """Patch each module of ``patches`` (name -> patch) when it is imported and
    ``when(patch)`` holds then; installed once per process."""
    if not any(hasattr(f, "patches") and hasattr(f, "when") for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder(patches, when))
