"""No shipped file points at a machine that exists: every address in the checkout is loopback,
private, or reserved for documentation (RFC 5737, RFC 3849), and the shipped example host is
refused before anything is sent.

An example that names a real public address turns the very first `outrig deploy --host
uk-node` of a new user into an SSH connection to a stranger's machine."""

from __future__ import annotations

import ipaddress
import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.support.cli import outrig

ROOT = Path(__file__).resolve().parents[2]
IPV4 = re.compile(r"(?<![\w.])(?:\d{1,3}\.){3}\d{1,3}(?![\w.])")
IPV6 = re.compile(r"(?<![\w:.])(?:[0-9A-Fa-f]{0,4}:){2,7}[0-9A-Fa-f]{0,4}(?![\w:])")


def tracked_files() -> list[Path]:
    """The checkout's tracked files (git's list: what a clone holds, without .venv)."""
    listing = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                             check=True).stdout.decode()
    return [ROOT / name for name in listing.split("\0") if name]


def public_addresses(text: str) -> list[tuple[int, str]]:
    """(line, address) of every IPv4 or IPv6 address in ``text`` that is globally routable:
    not loopback, private, link-local or reserved for documentation."""
    found = []
    for pattern in (IPV4, IPV6):
        for match in pattern.finditer(text):
            try:
                address = ipaddress.ip_address(match.group(0))
            except ValueError:
                continue  # a version number, a time of day: not an address
            if address.is_global:
                found.append((text.count("\n", 0, match.start()) + 1, str(address)))
    return found


def test_the_scan_finds_public_addresses_and_passes_reserved_ones() -> None:
    # built from parts, so that this file holds no public address for the scan below to find
    v4 = ".".join(("217", "138", "104", "34"))
    v6 = ":".join(("2a00", "1450", "4009", "81f", "", "200e"))
    text = (f"hostname: {v4}\nvia {v6}\n"
            "ok: 127.0.0.1 10.0.0.1 192.0.2.4 198.51.100.7 203.0.113.9 ::1 2001:db8::5\n"
            "version 2.13.0 at 12:30:45\n")
    assert public_addresses(text) == [(1, v4), (2, v6)]


def test_no_tracked_file_names_a_public_address() -> None:
    offenders = []
    for path in tracked_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, IsADirectoryError, FileNotFoundError):
            continue  # a picture, a link to a folder, a file removed in the work tree
        offenders += [f"{path.relative_to(ROOT)}:{line}: {address}"
                      for line, address in public_addresses(text)]
    assert not offenders, ("use an address reserved for documentation (192.0.2.0/24, "
                           "198.51.100.0/24, 203.0.113.0/24, 2001:db8::/32) instead of:\n"
                           + "\n".join(offenders))


def test_deploying_to_the_shipped_example_host_is_refused_before_anything_is_sent(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.chdir(ROOT)
    code, out, err = outrig(["deploy", "--host", "uk-node", "--playbook", "smoke"], capsys)
    assert code == 2
    assert "placeholder" in err and "hosts/uk-node.yaml" in err and "Nothing was sent" in err
    assert "plan:" not in out  # refused before a plan suggests that a deploy began
    runs = list((tmp_path / "state").rglob("runs/*.json"))
    assert runs == []  # nothing journalled: no run was begun


def test_the_shipped_example_host_still_plans(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`plan` and `deploy --dry-run` send nothing, so they work on the example as written."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.chdir(ROOT)
    code, out, err = outrig(["plan", "--host", "uk-node", "--playbook", "smoke", "--json"],
                            capsys)
    assert code == 0, err
    assert json.loads(out.splitlines()[-1])["host"] == "uk-node"
