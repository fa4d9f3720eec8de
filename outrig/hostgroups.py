"""``--host`` as a selection: several hosts, group names and ``all`` → a list of host specs.

``--host`` may be repeated and each value may hold several names separated by commas. A name
is a group of ``hosts/groups.yaml`` (``groups: {name: [member, ...]}``), ``all`` (every host
file in ``hosts/``), or one host as :func:`outrig.inventory.resolve_host` takes it (a host
file name, an ``~/.ssh/config`` alias, ``user@host:port``, ``local``). A group's members are
any of these, other groups included.

Everything here is pure reading of the project's files: the whole selection is resolved, and
every host in it checked by :func:`~outrig.inventory.resolve_host`, before any box is
contacted, so a misspelt member stops the command with nothing sent.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import yaml

from outrig.errors import ConfigError
from outrig.inventory import GROUPS_FILE, Host, HostBook, host_files

ALL = "all"


def split_values(values: Iterable[str]) -> list[str]:
    """``--host a,b --host c`` → ``[a, b, c]`` (blanks dropped; order kept)."""
    return [part.strip() for value in values for part in value.split(",") if part.strip()]


def read_groups(hosts_dir: Path) -> dict[str, list[str]]:
    """``hosts/groups.yaml`` as ``{group: [member, ...]}`` (empty when there is no file);
    a wrong shape is a ConfigError naming the file, the key and the fix."""
    path = hosts_dir / GROUPS_FILE
    if not path.is_file():
        return {}
    try:
        data: Any = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: cannot read it as YAML ({exc}); fix or remove the "
                          "file") from None
    if data is None:
        return {}
    example = "e.g. 'groups: {sweep: [node-a, node-b]}'"
    if not isinstance(data, dict) or set(data) - {"groups"}:
        raise ConfigError(f"{path}: must hold one key, groups: ({example})")
    groups = data.get("groups") or {}
    if not isinstance(groups, dict):
        raise ConfigError(f"{path}: groups: must map each group name to a list of hosts "
                          f"({example})")
    out: dict[str, list[str]] = {}
    for name, members in groups.items():
        if not isinstance(members, list) or not all(isinstance(m, str) for m in members):
            raise ConfigError(f"{path}: groups.{name}: must be a list of host names "
                              f"({example})")
        if str(name) == ALL:
            raise ConfigError(f"{path}: groups.{ALL}: 'all' already means every host file "
                              "in hosts/; give the group another name")
        if str(name) in host_files(hosts_dir):
            raise ConfigError(f"{path}: groups.{name}: there is also a host file "
                              f"{hosts_dir}/{name}.yaml; give the group another name so "
                              f"that --host {name} means one thing")
        out[str(name)] = [m.strip() for m in members]
    return out


def names_several(value: str, hosts_dir: Path) -> bool:
    """Whether a ``--host`` value is a selection rather than one host: a list, ``all`` or a
    group of ``hosts/groups.yaml``."""
    names = split_values([value])
    if len(names) != 1:
        return len(names) > 1
    return names[0] == ALL or names[0] in read_groups(hosts_dir)


def expand_hosts(values: Iterable[str], hosts_dir: Path, *,
                 book: Callable[[str], Host] | None = None) -> list[str]:
    """The host specs a ``--host`` selection names, in order, each once; every one checked
    through ``book`` (the command's :class:`~outrig.inventory.HostBook`, which keeps each
    host resolved for the rest of the command; one of its own without it; no network).

    Raises ConfigError for an empty selection, an empty group, a group that contains itself
    (through any chain), ``all`` with no host files, or a name that is neither a group nor a
    host."""
    names = split_values(values)
    if not names:
        raise ConfigError("--host is empty; pass a name from hosts/, a group of "
                          f"hosts/{GROUPS_FILE}, 'all', an ssh alias or user@host:port")
    groups = read_groups(hosts_dir)
    if len(names) == 1 and names[0] != ALL and names[0] not in groups and not groups:
        return names  # one host, in a project without groups: resolved as it always was
    path = hosts_dir / GROUPS_FILE
    specs: list[str] = []
    for name in names:
        for spec in _expand(name, groups, hosts_dir, path, ()):
            if spec not in specs:
                specs.append(spec)
    resolve = book or HostBook(hosts_dir)
    for spec in specs:
        _check_host(spec, groups, hosts_dir, resolve)
    return specs


def _expand(name: str, groups: dict[str, list[str]], hosts_dir: Path, path: Path,
            chain: tuple[str, ...]) -> list[str]:
    """One name → host specs; ``chain`` is the groups being expanded (to find cycles)."""
    if name == ALL:
        found = host_files(hosts_dir)
        if not found:
            raise ConfigError(f"--host all: there are no host files in {hosts_dir}; create "
                              "hosts/NAME.yaml (see docs/hosts.md) or name the hosts")
        return found
    if name not in groups:
        return [name]
    if name in chain:
        loop = " → ".join((*chain[chain.index(name):], name))
        raise ConfigError(f"{path}: group {name!r} contains itself ({loop}); remove one of "
                          "these members so that no group includes itself")
    members = [m for m in groups[name] if m]
    if not members:
        raise ConfigError(f"{path}: groups.{name}: the group is empty; list its hosts "
                          f"(groups: {{{name}: [host-a, host-b]}}) or remove it")
    out: list[str] = []
    for member in members:
        out += _expand(member, groups, hosts_dir, path, (*chain, name))
    return out


def _check_host(spec: str, groups: dict[str, list[str]], hosts_dir: Path,
                resolve: Callable[[str], Host]) -> None:
    """Resolve ``spec`` as one host now, so a bad name fails before anything is sent; the
    error also names the groups, which a misspelt group name was meant to be."""
    try:
        resolve(spec)
    except ConfigError as exc:
        known = ", ".join(sorted(groups)) or f"none (no {hosts_dir / GROUPS_FILE})"
        where = [g for g, members in groups.items() if spec in members]
        inside = f" (a member of group {', '.join(where)})" if where else ""
        raise ConfigError(f"{exc} It is not a group either{inside}: known groups: {known}; "
                          "'all' means every host file. Nothing was sent.") from None
