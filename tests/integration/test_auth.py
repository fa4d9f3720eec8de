"""A refused key is an AuthenticationError wherever it surfaces: it is not a connection
failure, so the handlers for a broken link must not rewrite it into one."""

from __future__ import annotations

import io
import subprocess
from pathlib import Path

import pytest
import yaml

from outrig.errors import AuthenticationError, ConnectError
from outrig.ops.remote_exec import run_exec
from outrig.session import Project

pytestmark = pytest.mark.integration
PROJECT = Project(Path(__file__).resolve().parents[2])


def wrong_key_host(box_host: Path, tmp_path: Path) -> Path:
    """The sandbox's host file with a key the box does not know."""
    key = tmp_path / "wrong_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    config = yaml.safe_load(box_host.read_text())
    config["identity_file"] = str(key)
    host = tmp_path / "wrongkey.yaml"
    host.write_text(yaml.safe_dump(config))
    return host


def test_exec_with_a_refused_key_says_authentication_failed_not_link_broke(
        box_host: Path, tmp_path: Path) -> None:
    """``outrig exec`` wraps a link that breaks mid-command ("it may still be running on the
    box"); a refused key happens before anything runs and must keep its own message."""
    host = wrong_key_host(box_host, tmp_path)
    with pytest.raises(AuthenticationError) as info:
        run_exec(PROJECT, str(host), ["true"], out=io.BytesIO(), err=io.BytesIO())
    assert not isinstance(info.value, ConnectError)
    text = str(info.value)
    assert "authentication failed" in text and "wrong_key" in text
    assert "the link broke" not in text and "may still be running" not in text
