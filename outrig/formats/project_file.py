"""The project's own file, ``outrig.yaml`` (and ``invoke.yaml`` for a project set up for
``inv``): where the project is (found upward from the current folder) and what its file says.

Pure reading, beneath everything that needs a project's defaults: the command line's settings
(:mod:`outrig.cli.settings`) and the providers' keys (``providers:`` in ``outrig.yaml``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from outrig.errors import ConfigError

PROJECT_FILE = "outrig.yaml"
PROJECT_FILES = (PROJECT_FILE, "invoke.yaml", "invoke.yml")  # highest first
SETTINGS = ("host", "playbook", "project")  # config keys and OUTRIG_* variables


def find_project(start: Path) -> Path | None:
    """The nearest folder upward from ``start`` holding ``hosts/``, ``playbooks/`` or
    ``outrig.yaml``: users keep their hosts and playbooks in their own repositories."""
    here = start.resolve()
    for folder in (here, *here.parents):
        if ((folder / "playbooks").is_dir() or (folder / "hosts").is_dir()
                or (folder / PROJECT_FILE).is_file()):
            return folder
    return None


def read_project_file(root: Path, name: str = PROJECT_FILE) -> dict[str, Any]:
    """One config file of the project (an empty mapping when absent); a wrong shape is a
    ConfigError naming the file and key."""
    import yaml

    path = root / name
    if not path.is_file():
        return {}
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: cannot read it as YAML ({exc}); fix or remove the file") \
            from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: must be a mapping such as 'host: my-box' (one key a line)")
    for key in SETTINGS:
        if key in data and data[key] is not None and not isinstance(data[key], str):
            raise ConfigError(f"{path}: {key}: must be a name (text), not {data[key]!r}")
    return data


def read_project_config(root: Path) -> dict[str, tuple[str, Path]]:
    """The project's defaults, each with the file it came from: ``outrig.yaml`` first, then
    ``invoke.yaml`` (or ``invoke.yml``), so a project set up for ``inv`` works unchanged with
    ``outrig``, which Invoke itself would not read it for."""
    found: dict[str, tuple[str, Path]] = {}
    for name in PROJECT_FILES:
        data = read_project_file(root, name)
        for key in SETTINGS:
            if data.get(key) and key not in found:
                found[key] = (str(data[key]), root / name)
    return found
