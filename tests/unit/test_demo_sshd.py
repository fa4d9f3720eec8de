"""``inv demo`` on a machine without sshd installs openssh-server first (or says how)."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from outrig.console import Reporter
from outrig.errors import OutrigError
from outrig.ops import demo
from outrig.sandbox import box


def test_missing_sshd_is_installed_with_apt_get(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []
    state = {"installed": False}

    def find() -> str:
        if not state["installed"]:
            raise box.SandboxError("sshd not found: apt-get install -y openssh-server")
        return "/usr/sbin/sshd"

    def run(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        if argv[:2] == ["apt-get", "install"]:
            state["installed"] = True
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(box, "find_sshd", find)
    monkeypatch.setattr(demo.shutil, "which", lambda name: "/usr/bin/apt-get")
    monkeypatch.setattr(demo.os, "geteuid", lambda: 0)
    monkeypatch.setattr(demo.subprocess, "run", run)
    assert demo.ensure_sshd(Reporter(quiet=True)) == "/usr/sbin/sshd"
    assert calls == [["apt-get", "update", "-qq"],
                     ["apt-get", "install", "-y", "-qq", "openssh-server"]]


def test_failed_install_says_what_to_run(monkeypatch: pytest.MonkeyPatch) -> None:
    def find() -> str:
        raise box.SandboxError("sshd not found")

    monkeypatch.setattr(box, "find_sshd", find)
    monkeypatch.setattr(demo.shutil, "which", lambda name: "/usr/bin/apt-get")
    monkeypatch.setattr(demo.os, "geteuid", lambda: 0)
    monkeypatch.setattr(demo.subprocess, "run", lambda argv, **kw: subprocess.CompletedProcess(
        argv, 100, "", "E: Unable to locate package openssh-server"))
    with pytest.raises(OutrigError) as info:
        demo.ensure_sshd(Reporter(quiet=True))
    assert "Unable to locate package" in str(info.value)
    assert "apt-get install -y openssh-server" in str(info.value)


def test_without_root_the_sandbox_error_stands(monkeypatch: pytest.MonkeyPatch) -> None:
    def find() -> str:
        raise box.SandboxError("sshd not found: apt-get install -y openssh-server")

    monkeypatch.setattr(box, "find_sshd", find)
    monkeypatch.setattr(demo.os, "geteuid", lambda: 1000)
    with pytest.raises(box.SandboxError, match="apt-get install -y openssh-server"):
        demo.ensure_sshd(Reporter(quiet=True))
