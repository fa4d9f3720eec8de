"""A refused key is an AuthenticationError wherever it surfaces: it is not a connection
failure, so the handlers for a broken link must not rewrite it into one."""

from __future__ import annotations

import io
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from outrig.console import Reporter
from outrig.errors import AuthenticationError, ConfigError, ConnectError
from outrig.inventory import resolve_host
from outrig.journal import Journal
from outrig.ops.remote_exec import run_exec
from outrig.ops.status import status
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
        run_exec(PROJECT, resolve_host(str(host), hosts_dir=PROJECT.hosts_dir), ["true"],
                 out=io.BytesIO(), err=io.BytesIO())
    assert not isinstance(info.value, ConnectError)
    text = str(info.value)
    assert "authentication failed" in text and "wrong_key" in text
    assert "the link broke" not in text and "may still be running" not in text


@pytest.mark.parametrize("keep", ["0", "60"])
def test_a_missing_key_file_is_named_exit_2_and_the_box_is_never_contacted(
        box_host: Path, tmp_path: Path, make_proxy: Any, keep: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """identity_file: /nonexistent/key: not "went silent during authentication", not
    retried, nothing sent; through the warm connection (keeper) as through a direct one."""
    monkeypatch.setenv("OUTRIG_KEEP_SECONDS", keep)
    config = yaml.safe_load(box_host.read_text())
    proxy = make_proxy(config["port"], one_way_delay=0.0)
    config.update(port=proxy.port, identity_file="/nonexistent/key")
    host = tmp_path / "nokey.yaml"
    host.write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigError) as caught:
        status(PROJECT, str(host), Reporter(quiet=True), journal=Journal(tmp_path / "state"))
    text = str(caught.value)
    assert caught.value.exit_code == 2
    assert "the key file /nonexistent/key" in text and "does not exist" in text, text
    assert "silent" not in text and "authentication failed" not in text
    assert proxy.accepted == 0, "the box is not contacted for a key that is not there"


def test_no_usable_key_says_none_was_offered_and_which_were_looked_for(
        box_host: Path, tmp_path: Path, make_proxy: Any) -> None:
    """``--host root@127.0.0.1:PORT`` from a HOME without keys and no ssh-agent: an
    authentication failure that says no key was offered and where it looked, once."""
    config = yaml.safe_load(box_host.read_text())
    proxy = make_proxy(config["port"], one_way_delay=0.0)
    spec = f"{config.get('user') or 'root'}@127.0.0.1:{proxy.port}"
    with pytest.raises(AuthenticationError) as caught:
        status(PROJECT, spec, Reporter(quiet=True), journal=Journal(tmp_path / "state"))
    text = str(caught.value)
    assert "no key was offered" in text and "SSH_AUTH_SOCK is not set" in text, text
    assert "~/.ssh/id_ed25519" in text and "silent" not in text
    assert proxy.accepted == 1, "an authentication failure is never retried"
