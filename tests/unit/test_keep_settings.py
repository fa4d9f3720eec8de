"""Where the warm connection's idle time comes from, and which connector the ``ssh`` row
builds (connectors/keeper/client.py); no box needed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from outrig.cli.settings import settings_for
from outrig.connectors.keeper.client import (
    DEFAULT_KEEP_SECONDS,
    KEEP_ENV,
    KeptTransport,
    keep_seconds_for,
    ssh_connector,
)
from outrig.connectors.keeper.wire import UnsafePlace, key_of, private_dir
from outrig.connectors.ssh.transport import SSHTransport
from outrig.console import Reporter
from outrig.errors import ConfigError
from outrig.inventory import Host, HostBook
from outrig.journal import Journal
from outrig.session import HostSession
from outrig.transport import transport_for
from tests.support.hosts import write_host_file

BOX = Host(name="box", hostname="10.0.0.5", workdir="/w", port=2222, user="u")


def test_default_is_ten_minutes_and_env_wins_over_the_host_file(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEEP_ENV)
    assert keep_seconds_for(BOX) == DEFAULT_KEEP_SECONDS == 600
    host = Host(name="box", hostname="10.0.0.5", workdir="/w", keep_seconds=30)
    assert keep_seconds_for(host) == 30
    monkeypatch.setenv(KEEP_ENV, "5")
    assert keep_seconds_for(host) == 5
    monkeypatch.setenv(KEEP_ENV, "soon")
    with pytest.raises(ConfigError, match=KEEP_ENV):
        keep_seconds_for(host)


def test_ssh_row_builds_the_kept_connector_unless_keeping_is_off(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEEP_ENV, "0")
    plain = transport_for(BOX)
    assert type(plain) is SSHTransport
    monkeypatch.setenv(KEEP_ENV, "60")
    kept = ssh_connector(BOX)
    assert isinstance(kept, KeptTransport) and kept.keep_seconds == 60
    assert isinstance(transport_for(BOX), KeptTransport)


def test_keepers_are_per_address_user_and_key() -> None:
    other_user = Host(name="box", hostname="10.0.0.5", workdir="/w", port=2222, user="v")
    same = Host(name="alias", hostname="10.0.0.5", workdir="/elsewhere", port=2222, user="u")
    assert key_of(BOX) != key_of(other_user)
    assert key_of(BOX) == key_of(same), "the workdir and the name do not change the link"


def test_private_dir_is_made_0700_and_an_open_one_refused(tmp_path: Path) -> None:
    made = private_dir(tmp_path / "run")
    assert os.stat(made).st_mode & 0o777 == 0o700
    os.chmod(made, 0o750)
    with pytest.raises(UnsafePlace, match="not a private folder"):
        private_dir(made)


def test_no_keep_and_the_project_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """settings_for resolves the command's setting once: --no-keep, then the variable, then
    outrig.yaml; a task that opens no connector (no_keep=None) leaves it unset."""
    (tmp_path / "hosts").mkdir()
    (tmp_path / "outrig.yaml").write_text(yaml.safe_dump({"keep_seconds": 90}))
    monkeypatch.delenv(KEEP_ENV)
    assert settings_for(None, str(tmp_path), no_keep=False).project.keep_seconds == 90
    assert settings_for(None, str(tmp_path), no_keep=True).project.keep_seconds == 0
    assert settings_for(None, str(tmp_path)).project.keep_seconds is None
    monkeypatch.setenv(KEEP_ENV, "5")
    assert settings_for(None, str(tmp_path), no_keep=False).project.keep_seconds == 5
    assert settings_for(None, str(tmp_path), no_keep=True).project.keep_seconds == 0
    (tmp_path / "outrig.yaml").write_text(yaml.safe_dump({"keep_seconds": "later"}))
    monkeypatch.delenv(KEEP_ENV)
    with pytest.raises(ConfigError, match="keep_seconds"):
        settings_for(None, str(tmp_path), no_keep=False)


def test_the_setting_reaches_the_connector_through_the_project_not_the_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each command's session builds its connector from its project's setting; nothing is
    written to os.environ, so two commands in one process do not leak into each other."""
    (tmp_path / "hosts").mkdir()
    write_host_file(tmp_path, "box", hostname="10.0.0.5", port=2222, user="u", workdir="/w")
    (tmp_path / "outrig.yaml").write_text(yaml.safe_dump({"keep_seconds": 90}))
    monkeypatch.delenv(KEEP_ENV)
    before = dict(os.environ)
    journal = Journal(tmp_path / "state")
    off = settings_for(None, str(tmp_path), no_keep=True)
    on = settings_for(None, str(tmp_path), no_keep=False)
    plain = HostSession(off.project, "box", Reporter(quiet=True), journal,
                        host=HostBook(off.project.hosts_dir)("box"))
    kept = HostSession(on.project, "box", Reporter(quiet=True), journal,
                       host=HostBook(on.project.hosts_dir)("box"))
    assert type(plain.transport) is SSHTransport
    assert isinstance(kept.transport, KeptTransport) and kept.transport.keep_seconds == 90
    assert dict(os.environ) == before


def test_the_commands_setting_wins_over_the_variable_and_the_host_file(
        monkeypatch: pytest.MonkeyPatch) -> None:
    host = Host(name="box", hostname="10.0.0.5", workdir="/w", keep_seconds=30)
    monkeypatch.setenv(KEEP_ENV, "60")
    assert keep_seconds_for(host, 0.0) == 0 and keep_seconds_for(host, 7.0) == 7
    assert type(ssh_connector(host, keep_seconds=0.0)) is SSHTransport
    assert type(transport_for(host, keep_seconds=0.0)) is SSHTransport
    assert keep_seconds_for(host) == 60
