"""Hosts: ``--host`` → a typed :class:`Host`.

``--host`` accepts, in this order:
1. ``local``: run the agent on this machine, no SSH (for a box you are logged into);
2. a file name in ``hosts/`` (``uk-node`` → ``hosts/uk-node.yaml``) or a path to a YAML file;
3. an alias from ``~/.ssh/config`` (``Host uk-node``);
4. ``user@host:port`` (any part but the host optional).
Anything else is an error that lists what was tried, before any connection is made.

SSH settings left unset here (user, port, identity) are filled in by ``~/.ssh/config`` when the
connection is built (see :mod:`outrig.connectors.ssh.transport`), so the same alias works in
``ssh`` and here.
"""

from __future__ import annotations

import ipaddress
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from outrig.errors import ConfigError, OutrigError, did_you_mean
from outrig.formats.yamlfile import YamlDoc, load_yaml, validation_messages

DEFAULT_WORKDIR = "~/outrig"
# Addresses reserved for documentation (RFC 5737, RFC 3849): no box has one, so a host with
# one is a placeholder (``outrig init`` writes 203.0.113.10) that was never edited.
DOCUMENTATION_NETWORKS = tuple(ipaddress.ip_network(net) for net in (
    "192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "2001:db8::/32"))
GROUPS_FILE = "groups.yaml"  # hosts/groups.yaml: the groups of outrig.hostgroups, not a host
_SPEC = re.compile(r"^(?:(?P<user>[^@/\s]+)@)?(?P<host>\[[0-9a-fA-F:.]+\]|[^:@/\s\[\]]+)"
                   r"(?::(?P<port>\d{1,5}))?$")


@dataclass(frozen=True)
class Host:
    """Where to run. ``name`` is what the user typed; it keys the journal."""

    name: str
    hostname: str
    workdir: str
    port: int | None = None
    user: str | None = None
    identity_file: str | None = None
    known_hosts: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    python: str = "python3"
    gpus: Literal["auto"] | int = "auto"
    connect_timeout: float | None = None
    keep_seconds: float | None = None
    source: str = ""
    is_local: bool = False
    node_address: str | None = None
    provider: str | None = None  # rented through outrig: the provider and its box's id
    instance_id: str | None = None

    def peer_address(self) -> str:
        """How the other nodes of a multi-node job reach this box (``${head_host}`` when it
        is node 0): ``node_address:`` from the host file, else the SSH hostname (this
        machine's loopback for ``hostname: local``)."""
        if self.node_address:
            return self.node_address
        return "127.0.0.1" if self.is_local else self.hostname.strip("[]")

    def describe(self) -> str:
        """``root@203.0.113.7:10978`` (what a person would type to ssh there)."""
        if self.is_local:
            return "local"
        user = f"{self.user}@" if self.user else ""
        port = f":{self.port}" if self.port else ""
        return f"{user}{self.hostname}{port}"

    def label(self, address: str | None = None) -> str:
        """The host as the user named it, then where it is: ``sandbox (root@127.0.0.1:44259)``
        (``address``: what the connection really used, else :meth:`describe`); the name
        alone when it is the address (``--host root@203.0.113.7:22``, an ssh alias). Messages
        name hosts this way, so the name in them is the one to type in the next command."""
        address = address or self.describe()
        return self.name if address == self.name else f"{self.name} ({address})"

    def refuse_placeholder(self) -> None:
        """Raise :class:`ConfigError` before anything is sent to a host whose address is
        reserved for documentation: the starter host file of ``outrig init`` not yet edited
        (or an example copied from the docs). Connecting would only time out, with a message
        about the link instead of the file to edit."""
        if self.is_local or not is_placeholder_address(self.hostname):
            return
        if self.source.endswith((".yaml", ".yml")):
            raise ConfigError(
                f"host {self.name} is a placeholder: hostname: {self.hostname} is an "
                "address reserved for documentation, which no box has. Edit "
                f"{self.source} (hostname: your box's address or ~/.ssh/config alias, with "
                f"its user:, port: and workdir:), then `outrig check --host {self.name}`. "
                "Nothing was sent.")
        raise ConfigError(
            f"--host {self.name}: {self.hostname} is an address reserved for documentation, "
            "which no box has; pass your box's address, host file name or ssh alias. Nothing "
            "was sent.")


def is_placeholder_address(hostname: str) -> bool:
    """Whether ``hostname`` is an IP address in :data:`DOCUMENTATION_NETWORKS`."""
    try:
        address = ipaddress.ip_address(hostname.strip("[]"))
    except ValueError:
        return False
    return any(address in network for network in DOCUMENTATION_NETWORKS)


def ssh_config_hostnames(path: Path | None = None) -> set[str]:
    """Concrete ``Host`` names (no wildcards) in the user's SSH configuration, its ``Include``
    files followed (:func:`outrig.hosts.ssh_config.config_host_names`): an alias defined only in an
    included file is an alias as it is for ``ssh``. Imported here: a host file (the usual
    ``--host``) needs none of it."""
    from outrig.hosts.ssh_config import config_host_names

    return config_host_names(str(path) if path else None)


_TEXT_KEYS = ("hostname", "workdir", "user", "identity_file", "known_hosts", "python",
              "node_address", "provider", "instance_id")
_HOST_FILE_KEYS = frozenset((*_TEXT_KEYS, "port", "env", "gpus", "connect_timeout",
                             "keep_seconds"))


def _plain_number(value: object) -> float | None:
    """An int or a finite float as the model's float fields keep it; None for anything a
    lax model might convert (a bool, a string of digits) or refuse (nan, inf)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def plain_host_file(data: object) -> dict[str, Any] | None:
    """A host file's values, read without pydantic, when every key and value is one that
    :class:`~outrig.hosts.file_model.HostFile` takes unchanged; None for anything else (an
    unknown key, a port written as a string, a relative workdir...), which the model then
    judges and names. Only the plain case is read here, so nothing is accepted here that the
    model refuses or would convert (tests/unit/test_inventory.py compares the two)."""
    if not isinstance(data, dict) or not set(data) <= _HOST_FILE_KEYS:
        return None
    if not {"hostname", "workdir"} <= set(data):
        return None
    values: dict[str, Any] = {"port": None, "user": None, "identity_file": None,
                              "known_hosts": None, "env": {}, "python": "python3",
                              "gpus": "auto", "connect_timeout": None, "keep_seconds": None,
                              "node_address": None, "provider": None, "instance_id": None}
    for key in _TEXT_KEYS:
        if key in data:
            value = data[key]
            optional = key not in {"hostname", "workdir", "python"}
            if value is None and optional:
                values[key] = None
                continue
            if type(value) is not str:
                return None
            values[key] = value
    workdir = values["workdir"]
    if not workdir.startswith(("/", "~")) or workdir.rstrip("/") in {"", "~"}:
        return None
    if "" in (values["node_address"], values["provider"], values["instance_id"]):
        return None
    port = data.get("port")
    if port is not None and (type(port) is not int or not 1 <= port <= 65535):
        return None
    values["port"] = port
    gpus = data.get("gpus", "auto")
    if gpus != "auto" and (type(gpus) is not int or gpus < 0):
        return None
    values["gpus"] = gpus
    for key, least in (("connect_timeout", None), ("keep_seconds", 0.0)):
        raw = data.get(key)
        if raw is None:
            continue
        number = _plain_number(raw)
        if number is None or (number <= 0 if least is None else number < least):
            return None
        values[key] = number
    env = data.get("env", {})
    if not isinstance(env, dict) or not all(type(k) is str and type(v) is str
                                            for k, v in env.items()):
        return None
    values["env"] = dict(env)
    return values


def _validated_host_file(doc: YamlDoc) -> dict[str, Any]:
    """The host file's values as the model gives them, or its mistakes as a ConfigError
    that names each key and line."""
    from pydantic import ValidationError

    from outrig.hosts.file_model import HostFile

    try:
        return HostFile.model_validate(doc.data).model_dump()
    except ValidationError as exc:
        lines = validation_messages(doc, list(exc.errors()))
        raise ConfigError(
            f"host file {doc.path} is not valid:\n" + "\n".join(f"  - {line}" for line in lines)
        ) from None


def _host_from_file(name: str, path: Path) -> Host:
    doc = load_yaml(path, what="host file")
    spec = plain_host_file(doc.data)
    if spec is None:
        spec = _validated_host_file(doc)
    return Host(
        name=name, hostname=spec["hostname"], port=spec["port"], user=spec["user"],
        identity_file=spec["identity_file"], known_hosts=spec["known_hosts"],
        workdir=spec["workdir"], env=dict(spec["env"]), python=spec["python"],
        gpus=spec["gpus"], connect_timeout=spec["connect_timeout"],
        keep_seconds=spec["keep_seconds"], source=str(path),
        node_address=spec["node_address"], is_local=spec["hostname"] == "local",
        provider=spec["provider"], instance_id=spec["instance_id"],
    )


def _bad_port(spec: str) -> None:
    """``user@host:abc``: say that the port is not a number, not that the host is unknown."""
    address = spec.rpartition("@")[2]
    if address.startswith("["):  # [v6]:port
        tail = address.partition("]")[2]
        port = tail[1:] if tail.startswith(":") else None
    else:
        port = address.rpartition(":")[2] if address.count(":") == 1 else None
    if port is not None and not port.isdigit():
        raise ConfigError(f"--host {spec}: the port {port!r} is not a number; write "
                          "user@host:PORT with PORT from 1 to 65535 (or leave :PORT out for 22)")


def host_files(hosts_dir: Path) -> list[str]:
    """The names of the host files in ``hosts/`` (what ``--host all`` means, and what an
    unknown name is told to choose from), sorted; the groups file
    (:mod:`outrig.hostgroups`) is not a host file."""
    if not hosts_dir.is_dir():
        return []
    names = {p.stem for p in hosts_dir.iterdir()
             if p.suffix in {".yaml", ".yml"} and p.is_file() and not p.name.startswith(".")}
    names.discard(Path(GROUPS_FILE).stem)
    return sorted(names)


NAME_MAX = 250  # a file name's 255 bytes less ".yaml"


def _refuse_overlong(spec: str) -> None:
    """A ``--host`` value no host file, alias or address can be (it ended in ``OSError: File
    name too long`` from the file look-up): a host name has at most 253 characters, a file
    name 255 bytes."""
    longest = max(len(part.encode()) for part in spec.split("/"))
    if longest > NAME_MAX:
        raise ConfigError(f"--host {spec[:40]}…: {len(spec)} characters, longer than any host "
                          "file name, ssh alias or host name can be (a name of at most "
                          f"{NAME_MAX}); pass a name from hosts/, an ssh alias or "
                          "user@host:port. Nothing was sent.")


class HostBook:
    """The hosts one command names, each resolved once (:func:`resolve_host`, no network) and
    then looked up by its spelling as typed, which messages and fix commands repeat. A
    command's target makes one (:class:`outrig.cli.targets.Target`) and hands it to the ops,
    which then never resolve a ``--host`` value themselves; an op called without one (a test,
    another op) gets a book of its own. One command's book: a host file written or edited
    later is read by the next command's."""

    def __init__(self, hosts_dir: Path) -> None:
        self.hosts_dir = hosts_dir
        self._hosts: dict[str, Host] = {}

    def __call__(self, spec: str) -> Host:
        """``spec`` as a :class:`Host` (a ConfigError, exit 2, when it names none)."""
        if spec not in self._hosts:
            self._hosts[spec] = resolve_host(spec, hosts_dir=self.hosts_dir)
        return self._hosts[spec]

    def filed_under(self, spec: str) -> str:
        """The name a host's runs are filed under in the journal (what the user typed; a
        host file's path becomes its name; ``spec`` itself when it names no host now)."""
        try:
            return self(spec).name
        except OutrigError:
            return spec

    def knows(self, spec: str) -> bool:
        """Whether ``spec`` still names a host (its host file may have been removed)."""
        try:
            self(spec)
        except ConfigError:
            return False
        return True


def resolve_host(spec: str, *, hosts_dir: Path, workdir: str | None = None) -> Host:
    """Turn a ``--host`` value into a :class:`Host` (no network)."""
    spec = spec.strip()
    if not spec:
        raise ConfigError("--host is empty; pass a name from hosts/, an ssh alias or "
                          "user@host:port")
    _refuse_overlong(spec)
    if spec == "local":
        return Host(name="local", hostname="localhost", workdir=workdir or DEFAULT_WORKDIR,
                    source="local", is_local=True)
    as_path = Path(spec).expanduser()
    if as_path.suffix in {".yaml", ".yml"}:
        if not as_path.is_file():
            raise ConfigError(f"host file {as_path} does not exist")
        return _host_from_file(as_path.stem, as_path)
    for suffix in (".yaml", ".yml"):
        path = hosts_dir / f"{spec}{suffix}"
        if path.is_file():
            return _host_from_file(spec, path)
    if spec in ssh_config_hostnames():
        return Host(name=spec, hostname=spec, workdir=workdir or DEFAULT_WORKDIR,
                    source="~/.ssh/config")
    match = _SPEC.match(spec)
    if match and ("@" in spec or ":" in spec or "." in spec):
        host = match.group("host").strip("[]")
        port = int(match.group("port")) if match.group("port") else None
        if port is not None and not 1 <= port <= 65535:
            raise ConfigError(f"--host {spec}: port {port} is out of range 1-65535")
        return Host(name=spec, hostname=host, port=port, user=match.group("user"),
                    workdir=workdir or DEFAULT_WORKDIR, source="command line")
    _bad_port(spec)
    known = host_files(hosts_dir)
    hint = f" Known host files: {', '.join(known)}." if known else ""
    hint += did_you_mean(spec, [*known, *sorted(ssh_config_hostnames())])
    raise ConfigError(
        f"unknown host {spec!r}: there is no {hosts_dir}/{spec}.yaml and no 'Host {spec}' in "
        f"~/.ssh/config.{hint} Create hosts/{spec}.yaml (see docs/hosts.md), add the alias to "
        "~/.ssh/config, or pass user@host:port."
    )
