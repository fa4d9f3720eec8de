"""What the provisioning tests install from: minimal valid wheels, an environments playbook,
and an agent call that counts its execs on the box."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path
from typing import Any

from outrig.agent.client import AgentCall
from tests.support.runs import write_playbook


def make_wheel(folder: Path, name: str, version: str) -> Path:
    """A minimal valid pure-Python wheel (METADATA, WHEEL, RECORD with sha256s)."""
    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": f"__version__ = {version!r}\n".encode(),
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: outrig-tests\nRoot-Is-Purelib: true\n"
                         b"Tag: py3-none-any\n",
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(out, "w") as archive:
        for path, data in files.items():
            archive.writestr(path, data)
    return out


class CountingCall(AgentCall):
    """AgentCall that counts execs (each ``run`` is one exec on the box)."""

    calls = 0

    def run(self, request: dict[str, Any], on_event: Any = None,
            **options: Any) -> dict[str, Any]:
        CountingCall.calls += 1
        return super().run(request, on_event, **options)


def envs_playbook(tmp_path: Path, environments: dict[str, Any],
                  requires: dict[str, Any] | None = None) -> Path:
    """``envs.yaml``: one no-op process and these ``environments:`` (and ``requires:``)."""
    body: dict[str, Any] = {"processes": {"noop": {"command": "true"}},
                            "environments": environments}
    if requires is not None:
        body["requires"] = requires
    return write_playbook(tmp_path, body, name="envs")
