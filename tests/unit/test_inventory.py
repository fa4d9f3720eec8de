"""--host resolution: host files, ssh aliases, user@host:port, local; clear errors otherwise."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from outrig.errors import ConfigError
from outrig.inventory import resolve_host, ssh_config_hostnames

HOSTS = Path(__file__).resolve().parents[2] / "hosts"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


def test_shipped_uk_node_host_file(home: Path) -> None:
    host = resolve_host("uk-node", hosts_dir=HOSTS)
    assert (host.hostname, host.port, host.user) == ("203.0.113.10", 10978, "root")
    assert host.workdir == "/workspace/dflash"
    assert host.env["PATH"] == "/root/.local/bin:$PATH"
    assert host.gpus == "auto"


def test_user_host_port_spec(home: Path) -> None:
    host = resolve_host("ubuntu@203.0.113.7:40222", hosts_dir=HOSTS)
    assert (host.user, host.hostname, host.port) == ("ubuntu", "203.0.113.7", 40222)


def test_ipv6_spec(home: Path) -> None:
    host = resolve_host("root@[::1]:2222", hosts_dir=HOSTS)
    assert (host.hostname, host.port) == ("::1", 2222)


def test_ssh_config_alias_is_accepted(home: Path) -> None:
    (home / ".ssh").mkdir()
    (home / ".ssh" / "config").write_text("Host gpu-box\n  HostName 203.0.113.9\n  Port 40222\n")
    host = resolve_host("gpu-box", hosts_dir=HOSTS)
    assert host.hostname == "gpu-box" and host.source == "~/.ssh/config"


def test_unknown_host_lists_what_was_tried(home: Path) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_host("uk-nod", hosts_dir=HOSTS)
    text = str(info.value)
    assert "no " in text and "uk-nod.yaml" in text and "Host uk-nod" in text
    assert "Known host files: uk-node" in text


def test_local_host(home: Path) -> None:
    assert resolve_host("local", hosts_dir=HOSTS).is_local


def test_host_file_unknown_key_and_relative_workdir(tmp_path: Path, home: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("hostname: h\nworkdir: rel/dir\nportt: 22\n")
    with pytest.raises(ConfigError) as info:
        resolve_host(str(path), hosts_dir=HOSTS)
    text = str(info.value)
    assert "bad.yaml:3: portt: unknown key" in text
    assert "bad.yaml:2: workdir" in text and "absolute" in text


def test_host_file_bad_port(tmp_path: Path, home: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("hostname: h\nworkdir: /w\nport: 99999\n")
    with pytest.raises(ConfigError, match="bad.yaml:3: port"):
        resolve_host(str(path), hosts_dir=HOSTS)


@pytest.mark.parametrize("spec", ["user@h:abc", "h.example:22x", "root@[::1]:ssh"])
def test_port_that_is_not_a_number_is_named(home: Path, spec: str) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_host(spec, hosts_dir=HOSTS)
    assert "is not a number" in str(info.value) and "unknown host" not in str(info.value)


@pytest.mark.parametrize("keep", [0, 600])  # directly, and through a warm connection
def test_the_starter_host_file_is_refused_before_any_connection_naming_the_file(
        tmp_path: Path, home: Path, keep: int) -> None:
    """`outrig init` writes hostname: 203.0.113.10 (an address reserved for documentation):
    resolving and planning against it work, contacting it is refused with the file to edit,
    before a connection (or a keeper for one) is attempted."""
    from outrig.cli.starter import write_starter
    from outrig.connectors.keeper.client import keepers
    from outrig.transport import transport_for

    write_starter(tmp_path)
    host = resolve_host("box", hosts_dir=tmp_path / "hosts")  # resolving sends nothing
    assert host.hostname == "203.0.113.10"
    transport = transport_for(host, keep_seconds=keep)  # nor does opening it (lazily)
    with pytest.raises(ConfigError) as info:
        transport.start(["true"])
    text = str(info.value)
    assert f"Edit {tmp_path / 'hosts' / 'box.yaml'}" in text and "placeholder" in text
    assert "Nothing was sent" in text and transport.connect_seconds is None
    assert keepers() == []
    with pytest.raises(ConfigError, match="Edit .*box.yaml"):
        transport.connect()
    for address in ("ubuntu@192.0.2.4", "root@198.51.100.77:22", "root@[2001:db8::1]:22"):
        with pytest.raises(ConfigError, match="reserved for documentation"):
            transport_for(resolve_host(address, hosts_dir=tmp_path / "hosts"),
                          keep_seconds=keep).start(["true"])


def test_messages_name_the_host_as_typed_then_its_address(home: Path, tmp_path: Path) -> None:
    (tmp_path / "sandbox.yaml").write_text("hostname: 127.0.0.1\nport: 44259\nuser: root\n"
                                           "workdir: /w\n")
    host = resolve_host("sandbox", hosts_dir=tmp_path)
    assert host.label() == "sandbox (root@127.0.0.1:44259)"
    assert host.label("me@10.0.0.1:22") == "sandbox (me@10.0.0.1:22)"
    typed = resolve_host("root@127.0.0.1:2222", hosts_dir=tmp_path)
    assert typed.label() == "root@127.0.0.1:2222"  # the name is the address: said once


SSH_CONFIGS = {
    "aliases and wildcards": "Host gpu-a gpu-b\n  HostName 10.1.2.3\n  User me\n"
                             "Host *.lab !bad.lab\n  User lab\nHost *\n  ServerAliveInterval 30\n",
    "key in any case, with =, indented, comments": "# boxes\n\n   host=uk-node\n"
                                                   "HOST  us-node # not a comment\n"
                                                   "\tPort 2222\n",
    "quoted names": 'Host "quoted box" plain\n  HostName 10.0.0.5\n',
    "an unparsable line": "Host fine\n???\n",
    "an unbalanced quote": 'Host "open\nHost fine\n',
    "empty": "",
}


def paramikos_reading(path: Path) -> set[str]:
    """What paramiko's own parser says (how the names were read before): the reference."""
    import paramiko

    try:
        cfg = paramiko.SSHConfig.from_path(str(path))
    except Exception:
        return set()
    return {h for h in cfg.get_hostnames() if not any(c in h for c in "*?!")}


@pytest.mark.parametrize("text", list(SSH_CONFIGS.values()), ids=list(SSH_CONFIGS))
def test_ssh_config_aliases_are_read_as_paramiko_reads_them(tmp_path: Path, text: str) -> None:
    """The aliases come from the ``Host`` lines read without paramiko (whose import a command
    through a live keeper never needs), name for name as paramiko's ``SSHConfig`` reads
    them, an unreadable file giving none."""
    path = tmp_path / "config"
    path.write_text(text)
    assert ssh_config_hostnames(path) == paramikos_reading(path)


def test_a_match_block_does_not_hide_the_aliases(tmp_path: Path) -> None:
    """A ``Match`` block holds no names. (paramiko parses it, but its ``get_hostnames`` then
    raises KeyError: it reads ``entry["host"]``, which a Match block's entry lacks,
    paramiko/config.py; with paramiko's reading, any --host that was not a host file failed
    with a traceback for a user whose ssh config has one.)"""
    path = tmp_path / "config"
    path.write_text("Match host gpu-* user me\n  Port 2200\nHost after-match\n")
    assert ssh_config_hostnames(path) == {"after-match"}


def test_ssh_config_aliases_are_found_without_importing_paramiko(tmp_path: Path) -> None:
    import subprocess
    import sys

    path = tmp_path / "config"
    path.write_text(SSH_CONFIGS["aliases and wildcards"])
    probe = ("import sys; from pathlib import Path; "
             "from outrig.inventory import ssh_config_hostnames; "
             f"print(sorted(ssh_config_hostnames(Path({str(path)!r})))); "
             "print('paramiko' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120)
    assert done.stdout.split("\n")[:2] == ["['gpu-a', 'gpu-b']", "False"], done.stderr


# The plain reader (outrig.inventory.plain_host_file) against the model it stands in for
# (outrig.hosts.file_model.HostFile): every document it reads, it reads to the model's values;
# every document the model refuses or converts, it leaves to the model.
_BASE = {"hostname": "box", "workdir": "/w"}
_DOCS = [
    _BASE,
    {**_BASE, "port": 2222, "user": "root", "identity_file": "~/.ssh/k", "python": "python3.11",
     "known_hosts": "/k", "env": {"PATH": "/x:$PATH", "HF_HOME": "/data"}, "gpus": 4,
     "connect_timeout": 12, "keep_seconds": 0, "node_address": "10.0.0.2"},
    {**_BASE, "provider": "runpod", "instance_id": "abc123xyz"},
    {**_BASE, "gpus": "auto", "connect_timeout": 2.5, "keep_seconds": 30.0, "user": None},
    {**_BASE, "workdir": "~/runs", "env": {}},
    {"hostname": "local", "workdir": "/tmp/box"},
    # refused by the model
    {"hostname": "box"},
    {"workdir": "/w"},
    {**_BASE, "workdir": "relative"},
    {**_BASE, "workdir": "/"},
    {**_BASE, "workdir": "~/"},
    {**_BASE, "port": 0},
    {**_BASE, "port": 70000},
    {**_BASE, "gpus": -1},
    {**_BASE, "gpus": "all"},
    {**_BASE, "connect_timeout": 0},
    {**_BASE, "connect_timeout": float("nan")},
    {**_BASE, "keep_seconds": -1},
    {**_BASE, "env": {"PORT": 8000}},
    {**_BASE, "env": ["A=1"]},
    {**_BASE, "hostname": 12},
    {**_BASE, "python": None},
    {**_BASE, "node_address": ""},
    {**_BASE, "provider": ""},
    {**_BASE, "instance_id": 12},
    {**_BASE, "colour": "blue"},
    # converted by the model (lax mode): left to it
    {**_BASE, "port": "2222"},
    {**_BASE, "port": 22.0},
    {**_BASE, "port": True},
    {**_BASE, "gpus": "2"},
    {**_BASE, "connect_timeout": "5"},
    {**_BASE, "keep_seconds": True},
    {**_BASE, "connect_timeout": float("inf")},
    [],
    "hostname: box",
]


@pytest.mark.parametrize("doc", _DOCS, ids=range(len(_DOCS)))
def test_the_plain_host_file_reader_reads_only_what_the_model_takes_unchanged(doc: object
                                                                              ) -> None:
    from pydantic import ValidationError

    from outrig.hosts.file_model import HostFile
    from outrig.inventory import plain_host_file

    plain = plain_host_file(doc)
    try:
        model = HostFile.model_validate(doc).model_dump()
    except ValidationError:
        assert plain is None, f"read what the model refuses: {doc!r}"
        return
    if plain is not None:
        assert plain == model
        assert [type(plain[k]) for k in sorted(plain)] == [type(model[k]) for k in sorted(model)]
    else:  # declined: only where the model converts a value, or a number is not finite
        assert isinstance(doc, dict)
        assert any(model[k] != v or type(model[k]) is not type(v)
                   or (isinstance(v, float) and not math.isfinite(v))
                   for k, v in doc.items()), f"declined a plain host file: {doc!r}"


def test_every_plain_document_of_the_list_is_read_without_the_model() -> None:
    from outrig.inventory import plain_host_file

    assert [plain_host_file(d) is not None for d in _DOCS[:6]] == [True] * 6


def test_a_host_file_is_read_without_importing_pydantic(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.mkdir()
    (hosts / "box.yaml").write_text("hostname: 127.0.0.1\nport: 2222\nworkdir: /w\n"
                                    "env: {PATH: '/x:$PATH'}\n")
    code = ("import sys; from pathlib import Path; from outrig.inventory import resolve_host; "
            f"h = resolve_host('box', hosts_dir=Path({str(hosts)!r})); "
            "print(h.port, h.env['PATH'], 'pydantic' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.split() == ["2222", "/x:$PATH", "False"]


def test_a_host_file_mistake_is_still_named_by_the_model(tmp_path: Path, home: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("hostname: box\nworkdir: /w\nport: '70000'\n")
    with pytest.raises(ConfigError) as err:
        resolve_host(str(path), hosts_dir=tmp_path)
    assert f"{path}:3: port" in str(err.value)
