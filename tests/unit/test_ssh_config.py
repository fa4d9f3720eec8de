"""The SSH configuration read as OpenSSH reads it (outrig/hosts/ssh_config.py): ``Include`` (globs,
relative paths, inside blocks), ``Host`` and ``Match``, first value wins, ProxyCommand and
ProxyJump from any file, and a refusal, naming file and line, of what cannot be judged.
Where this machine has ``ssh``, the route is compared with ``ssh -G`` on the same files."""

from __future__ import annotations

import getpass
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from outrig.errors import ConfigError
from outrig.hosts import ssh_config
from outrig.hosts.ssh_config import split_words, ssh_route
from outrig.inventory import ssh_config_hostnames


@pytest.fixture
def ssh_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """``~/.ssh`` of the isolated HOME; no system configuration."""
    folder = Path.home() / ".ssh"
    folder.mkdir(mode=0o700, exist_ok=True)
    monkeypatch.setattr(ssh_config, "SYSTEM_CONFIG", str(tmp_path / "etc" / "ssh_config"))
    return folder


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_a_proxycommand_in_an_included_file_is_the_route(ssh_dir: Path) -> None:
    """The issue's configuration: the include first, HostName and Port after it."""
    write(ssh_dir, "config", "Include bastion.conf\nHost X\n  HostName 127.0.0.1\n  Port 2200\n")
    write(ssh_dir, "bastion.conf", "Host X\n  ProxyCommand python3 relay.py %h %p\n")
    route = ssh_route("X")
    assert (route.hostname, route.port) == ("127.0.0.1", 2200)
    assert route.proxy is not None and not route.direct
    assert route.proxy[1:] == ("-c", "exec python3 relay.py 127.0.0.1 2200")
    assert route.proxy_source == f"ProxyCommand in {ssh_dir / 'bastion.conf'} line 2"


def test_include_globs_absolute_and_tilde_paths_in_order(ssh_dir: Path, tmp_path: Path) -> None:
    write(ssh_dir, "config", f"Include conf.d/*.conf ~/.ssh/more {tmp_path / 'abs.conf'}\n")
    write(ssh_dir, "conf.d/20-b.conf", "Host gpu\n  Port 2020\n")
    write(ssh_dir, "conf.d/10-a.conf", "Host gpu\n  User first\n  Port 1010\n")
    write(ssh_dir, "more", "Host gpu\n  User second\n  HostName 10.0.0.9\n")
    write(tmp_path, "abs.conf", "Host gpu\n  ProxyJump me@gate:2222\n")
    route = ssh_route("gpu")
    assert (route.hostname, route.port, route.user) == ("10.0.0.9", 1010, "first")
    assert route.proxy == ("ssh", "-l", "me", "-p", "2222", "-W", "[10.0.0.9]:1010", "gate")
    assert ssh_config_hostnames() == {"gpu"}


def test_an_include_inside_a_block_applies_only_to_its_hosts(ssh_dir: Path) -> None:
    write(ssh_dir, "config", "Host corp-*\n  Include corp.conf\nHost *\n  User everyone\n")
    write(ssh_dir, "corp.conf", "ProxyJump gate\nUser corp\n")
    assert ssh_route("corp-1").proxy == ("ssh", "-W", "[corp-1]:22", "gate")
    assert ssh_route("corp-1").user == "corp"
    home = ssh_route("home")
    assert home.direct and home.user == "everyone"


def test_an_include_does_not_leak_its_match_state_back(ssh_dir: Path) -> None:
    """readconf.c: "don't let Match in includes clobber the containing file's Match state"."""
    write(ssh_dir, "config", "Host gpu\n  Include other.conf\n  Port 2222\n")
    write(ssh_dir, "other.conf", "Host elsewhere\n  User x\n")
    assert ssh_route("gpu").port == 2222


def test_the_first_value_wins_and_proxyjump_and_proxycommand_share_one_slot(
        ssh_dir: Path) -> None:
    write(ssh_dir, "config", "Host gpu\n  ProxyJump none\n  Port 1\nHost *\n  Port 2\n"
                             "  ProxyCommand nc %h %p\nHost other\n  ProxyCommand nc %h %p\n")
    route = ssh_route("gpu")
    assert route.direct and route.port == 1
    assert ssh_route("other").proxy is not None  # "Host *" comes first: nc, not ProxyJump


def test_the_host_file_goes_first_as_ssh_p_and_l_do(ssh_dir: Path) -> None:
    write(ssh_dir, "config", "Host gpu\n  Port 2222\n  User cfg\n")
    route = ssh_route("gpu", port=44, user="me")
    assert (route.port, route.user) == (44, "me")


def test_host_patterns_negation_and_case(ssh_dir: Path) -> None:
    write(ssh_dir, "config", "Host *.lab !bad.lab\n  ProxyJump gate\n")
    assert not ssh_route("GPU.LAB").direct
    assert ssh_route("bad.lab").direct
    assert ssh_route("gpu.home").direct


def test_match_host_originalhost_user_and_final(ssh_dir: Path) -> None:
    write(ssh_dir, "config", "Host short\n  HostName box.corp\n"
                             "Match host *.corp !originalhost direct\n  ProxyJump gate\n"
                             "Match final user nobody-*\n  Port 9\n"
                             f"Match user {getpass.getuser()} final\n  Port 2200\n")
    route = ssh_route("short")
    assert route.hostname == "box.corp" and route.port == 2200
    assert route.proxy is not None and route.proxy[-1] == "gate"


def test_match_exec_is_refused_where_it_decides_and_ssh_G_cannot_judge_it(
        ssh_dir: Path) -> None:
    """Here HOME is not the password database's home, where ssh reads its files."""
    config = write(ssh_dir, "config", "Match host gpu-* exec \"test -e /x\"\n  ProxyJump gate\n")
    assert ssh_route("other").direct  # host failed first: OpenSSH runs nothing either
    with pytest.raises(ConfigError, match=f"{config} line 1: 'Match exec' decides") as caught:
        ssh_route("gpu-1")
    assert "Match host ...,!gpu-1" in str(caught.value)


@pytest.mark.skipif(shutil.which("ssh") is None, reason="no OpenSSH client here")
@pytest.mark.parametrize("test,direct", [("true", False), ("false", True)])
def test_a_match_exec_that_decides_is_judged_by_ssh_G(
        ssh_dir: Path, monkeypatch: pytest.MonkeyPatch, test: str, direct: bool) -> None:
    """Where ssh reads the same files (made so here with -F and the home it reports), OpenSSH
    runs the exec and its answer is the route."""
    config = write(ssh_dir, "config", f"Match host gpu-* exec {test}\n  ProxyJump gate\n"
                                      "Host gpu-*\n  HostName 10.9.9.9\n  Port 2201\n")
    monkeypatch.setattr(ssh_config, "OPENSSH_G", ("ssh", "-G", "-F", str(config)))
    monkeypatch.setattr(ssh_config, "openssh_home", lambda: str(Path.home()))
    route = ssh_route("gpu-1", user="me")
    assert (route.hostname, route.port, route.user) == ("10.9.9.9", 2201, "me")
    assert route.direct is direct
    if not direct:
        assert route.proxy == ("ssh", "-W", "[10.9.9.9]:2201", "gate")
        assert route.proxy_source == "ProxyJump in `ssh -G gpu-1`"


@pytest.mark.parametrize("text,words", [
    ("Host gpu\n  CanonicalizeHostname yes\n", "CanonicalizeHostname yes applies to gpu"),
    ("Host gpu\n  ProxyCommand nc %h %C\n", "uses %C"),
    ("Host gpu\n  Port ssh\n", "Port 'ssh' is not a port"),
    ("Host gpu\n  ProxyCommand \"nc %h\n", "quote is not closed"),
    ("Match tagged x\n  Port 2\n", "cannot judge 'Match tagged'"),
    ("Include config\n", "includes itself"),
])
def test_what_cannot_be_judged_is_refused_with_file_and_line(ssh_dir: Path, text: str,
                                                             words: str) -> None:
    write(ssh_dir, "config", text)
    with pytest.raises(ConfigError, match=words) as caught:
        ssh_route("gpu")
    assert str(ssh_dir / "config") in str(caught.value)


def test_a_name_that_would_enter_the_proxy_command_as_shell_text_is_refused(
        ssh_dir: Path) -> None:
    write(ssh_dir, "config", "Host *\n  ProxyCommand nc %h %p\n")
    with pytest.raises(ConfigError, match="as shell text"):
        ssh_route("gpu;touch /tmp/x")


def test_words_split_as_openssh_splits_them() -> None:
    assert split_words('nc "a b" \'c d\' e\\ f # trailing', "here") == ["nc", "a b", "c d", "e f"]


def test_aliases_come_from_included_files_and_the_system_file(ssh_dir: Path,
                                                              tmp_path: Path) -> None:
    write(ssh_dir, "config", "Include conf.d/*\nHost top\n")
    write(ssh_dir, "conf.d/a", "Host only-included other-*\n")
    write(tmp_path / "etc", "ssh_config", f"Include {tmp_path / 'etc' / 'd'}/*.conf\n")
    write(tmp_path / "etc" / "d", "corp.conf", "Host corp-gate\n")
    assert ssh_config_hostnames() == {"top", "only-included", "corp-gate"}


@pytest.mark.skipif(shutil.which("ssh") is None, reason="no OpenSSH client here")
@pytest.mark.parametrize("name", ["X", "gpu.lab", "bad.lab", "corp-1", "short", "plain"])
def test_the_route_is_what_ssh_G_says_for_the_same_files(ssh_dir: Path, name: str) -> None:
    """OpenSSH itself as the reference. It takes ``~`` from the password database, so the
    files are given with absolute paths and read with ``-F`` (no system file, as here)."""
    conf = ssh_dir / "conf"
    write(ssh_dir, "config", f"Include {conf}/*.conf\nHost X\n  HostName 127.0.0.1\n"
                             "  Port 2200\nHost short\n  HostName box.corp\n"
                             "Match host *.corp\n  User corp\n  ProxyJump gate\n")
    write(conf, "10.conf", "Host X\n  ProxyCommand nc %h %p\nHost *.lab !bad.lab\n  Port 7\n"
                           "Host corp-*\n  ProxyJump a@b:3,c\n")
    route = ssh_route(name)
    done = subprocess.run(["ssh", "-G", "-F", str(ssh_dir / "config"), name],
                          capture_output=True, text=True, timeout=30,
                          env={**os.environ, "HOME": str(Path.home())})
    said: dict[str, str] = {}
    for line in done.stdout.splitlines():
        key, _, value = line.partition(" ")
        said.setdefault(key, value)
    assert route.hostname == said["hostname"] and str(route.port) == said["port"]
    assert (route.user or getpass.getuser()) == said["user"]
    if "proxycommand" in said:
        assert route.proxy is not None and route.proxy[2] == "exec " + said[
            "proxycommand"].replace("%h", route.hostname).replace("%p", str(route.port))
    elif "proxyjump" in said:
        assert route.proxy is not None and route.proxy[-1] == said["proxyjump"].split(",")[-1]\
            .rpartition("@")[2].partition(":")[0]
    else:
        assert route.direct
