"""The suite's one host-file writer: ``<root>/hosts/<name>.yaml`` from the fields given."""

from __future__ import annotations

from pathlib import Path

import yaml


def write_host_file(root: Path, name: str, **fields: object) -> Path:
    """Write the host file ``name`` of the project at ``root`` (its ``hosts/`` made when
    missing) and return its path; the fields are the host file's keys (docs/hosts.md)."""
    path = root / "hosts" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(fields))
    return path
