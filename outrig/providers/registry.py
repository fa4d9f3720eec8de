"""The providers outrig can rent from: one line each, ``name: "module:Class"``.

The class is built with the provider's own settings (``providers: NAME:`` in outrig.yaml).
Modules are imported only when their provider is used, so the list costs nothing at start-up.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, cast

from outrig.errors import ConfigError
from outrig.providers.base import Provider

PROVIDERS = {
    "runpod": "outrig.providers.runpod:RunPodProvider",
    "sandbox": "outrig.providers.sandbox:SandboxProvider",
    "vastai": "outrig.providers.vastai:VastProvider",
}


def provider_settings(root: Path, name: str) -> dict[str, Any]:
    """``providers: NAME:`` of the project's outrig.yaml ({} when absent)."""
    from outrig.formats.project_file import PROJECT_FILE, read_project_file

    section = read_project_file(root).get("providers") or {}
    if not isinstance(section, dict):
        raise ConfigError(f"{root / PROJECT_FILE}: providers: must be a mapping of provider "
                          f"name to its settings, e.g. 'providers: {{runpod: {{}}}}'")
    mine = section.get(name) or {}
    if not isinstance(mine, dict):
        raise ConfigError(f"{root / PROJECT_FILE}: providers: {name}: must be a mapping")
    return mine


def get_provider(name: str, root: Path) -> Provider:
    """The provider ``name`` with its settings; an unknown name is a ConfigError listing the
    known ones (nothing is rented)."""
    if name not in PROVIDERS:
        raise ConfigError(f"--provider {name!r} is not a provider outrig knows; use one of "
                          f"{', '.join(sorted(PROVIDERS))}. Nothing was rented.")
    module_name, _, class_name = PROVIDERS[name].partition(":")
    factory = getattr(importlib.import_module(module_name), class_name)
    return cast(Provider, factory(provider_settings(root, name), root))
