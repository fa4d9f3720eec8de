"""The SSH configuration read the way OpenSSH reads it: where a connection to a host goes.

Why not paramiko's ``SSHConfig`` (which Fabric uses): it has no ``Include``, so a
``ProxyCommand`` or ``ProxyJump`` kept in an included file was silently ignored and outrig
connected straight to the box where ``ssh`` went through the bastion. Why not ``ssh -G``:
OpenSSH takes ``~`` from the password database, not from ``HOME``, while the rest of outrig's
SSH stack (paramiko's keys, the known_hosts files) reads ``HOME``; one reading must serve
both. So the rules are OpenSSH's own (readconf.c, ssh.c; ssh_config(5)), for the keys that
decide the route, followed here:

- the files: ``~/.ssh/config`` then ``/etc/ssh/ssh_config``; ``Include`` with globs (sorted),
  several arguments, ``~``, and relative paths taken from ``~/.ssh`` (user files) or
  ``/etc/ssh`` (system files), up to 16 deep; an ``Include`` inside a ``Host``/``Match`` block
  reads its files only when the block applies, and what they match does not leak back out;
- ``Host`` patterns (``*``, ``?``, ``!negation``, case-insensitive) against the name given;
  ``Match`` with ``all``, ``host``, ``originalhost``, ``user``, ``localuser``, ``canonical``
  and ``final`` (a second pass when ``final`` appears), each negatable;
- the first value obtained wins (``IdentityFile`` adds up); ``ProxyCommand`` and ``ProxyJump``
  share one slot, so whichever comes first wins, and ``none`` takes the slot with no proxy;
- values set by the host file (``port:``, ``user:``) come first, as ``ssh -p`` / ``-l`` do.

A ``Match exec`` or ``Match localnetwork`` that would decide (its earlier criteria matched) is
OpenSSH's to judge: ``ssh -G`` answers for the whole host then (one process, a few ms), where
it reads the same files (``HOME`` is the password database's home) and there is an ``ssh``.
What cannot be judged is refused with the file and line (:class:`ConfigError`), never
guessed: such a ``Match`` where ``ssh -G`` cannot answer, an unknown ``Match`` criterion,
``CanonicalizeHostname`` switched on, an unknown ``%`` token, quoting that does not close, an
``Include`` loop. A proxy is never skipped: the
connection then goes through the command (:attr:`SSHRoute.proxy`), and nothing connects to the
box directly. ``ProxyJump`` becomes the command OpenSSH itself runs for it
(``ssh -l USER -p PORT -J REST -W [%h]:%p HOST``).
"""

from __future__ import annotations

import contextlib
import fnmatch
import glob
import os
import re
import shlex
from typing import NamedTuple

from outrig.errors import ConfigError

USER_CONFIG = "~/.ssh/config"
SYSTEM_CONFIG = "/etc/ssh/ssh_config"
MAX_INCLUDE_DEPTH = 16  # readconf.c, READCONF_MAX_DEPTH
# a host name or user that may enter a shell command (ProxyCommand's %h, %r): OpenSSH 9.6
# refuses the others too ("hostname contains invalid characters")
_SAFE = re.compile(r"[A-Za-z0-9._:@%\[\]-]+")


class SSHRoute(NamedTuple):
    """Where a connection to one host goes, after the SSH configuration. (Plain classes in
    this module, no dataclasses: an alias look-up imports it on the warm path.)"""

    hostname: str
    port: int
    user: str | None
    identity_files: tuple[str, ...] = ()
    proxy: tuple[str, ...] | None = None  # the proxy command's argv; None: connect directly
    proxy_source: str = ""  # "ProxyCommand in FILE line N", for messages

    @property
    def direct(self) -> bool:
        return self.proxy is None


def local_user() -> str:
    """This user's login name (OpenSSH's default ``User``); getpass imported only here."""
    import getpass

    return getpass.getuser()


class _Undecidable(Exception):
    """A ``Match`` criterion only OpenSSH itself can judge: never leaves this module
    (:func:`ssh_route` asks ``ssh -G``, or raises a :class:`ConfigError` with it)."""


class _Line:
    __slots__ = ("args", "key", "number", "path")

    def __init__(self, path: str, number: int, key: str, args: list[str]) -> None:
        self.path, self.number, self.key, self.args = path, number, key, args

    @property
    def where(self) -> str:
        return f"{self.path} line {self.number}"


def split_words(text: str, where: str) -> list[str]:
    """One line's words as OpenSSH's ``argv_split`` makes them: whitespace separates, single
    or double quotes group, a backslash escapes a quote, a backslash or a space, and an
    unquoted ``#`` at a word's start ends the line."""
    words: list[str] = []
    i, n = 0, len(text)
    while i < n:
        while i < n and text[i] in " \t":
            i += 1
        if i >= n or text[i] == "#":
            break
        word: list[str] = []
        quote = ""
        while i < n and (quote or text[i] not in " \t"):
            char = text[i]
            if char == "\\" and i + 1 < n and text[i + 1] in "'\"\\ " and quote != "'":
                word.append(text[i + 1])
                i += 2
                continue
            if quote and char == quote:
                quote = ""
            elif not quote and char in "'\"":
                quote = char
            else:
                word.append(char)
            i += 1
        if quote:
            raise ConfigError(f"the SSH configuration {where}: a {quote} quote is not "
                              "closed; close it (ssh itself refuses this line too)")
        words.append("".join(word))
    return words


def _lines(path: str) -> list[_Line]:
    """The configuration lines of one file (none when it cannot be read: OpenSSH skips a
    missing file too)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read()
    except OSError:
        return []
    lines: list[_Line] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = re.match(r"([^\s=]+)\s*(?:=\s*|\s+|$)(.*)", line)
        if match is None:
            continue
        where = f"{path} line {number}"
        lines.append(_Line(path, number, match.group(1).lower(),
                           split_words(match.group(2), where)))
    return lines


def _pattern_list_matches(value: str, patterns: str) -> bool:
    """OpenSSH's ``match_pattern_list``: comma-separated patterns (a ``Match`` criterion's
    value), judged as :func:`_host_line_matches` judges a ``Host`` line's words."""
    return _host_line_matches(value, patterns.split(","))


def _host_line_matches(host: str, patterns: list[str]) -> bool:
    """Whether ``host`` matches the patterns: ``!`` negates and a negated match wins;
    case-insensitive (host names are lowered before matching). A ``Host`` line's words are
    each one pattern, so a comma there is no separator."""
    found = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        if fnmatch.fnmatchcase(host.lower(), pattern[negated:].lower()):
            if negated:
                return False
            found = True
    return found


def _include_paths(argument: str, system: bool) -> list[str]:
    path = os.path.expanduser(argument)
    if not os.path.isabs(path):
        base = os.path.dirname(SYSTEM_CONFIG) if system else os.path.expanduser("~/.ssh")
        path = os.path.join(base, path)
    return sorted(glob.glob(path))


class _Reading:
    """One resolution: the options obtained so far (first wins) and what is being looked up."""

    def __init__(self, original: str) -> None:
        self.original = original
        self.final = False
        self.options: dict[str, tuple[list[str], str]] = {}
        self.identity: list[str] = []
        self.wants_final = False

    def read(self, path: str, system: bool, depth: int, stack: tuple[str, ...]) -> None:
        active = True
        for line in _lines(path):
            if line.key == "host":
                active = _host_line_matches(self.original, line.args)
            elif line.key == "match":
                active = self._match(line)
            elif line.key == "include":
                if active:
                    self._include(line, system, depth, stack)
            elif active:
                self._set(line)

    def _include(self, line: _Line, system: bool, depth: int, stack: tuple[str, ...]) -> None:
        if depth >= MAX_INCLUDE_DEPTH:
            raise ConfigError(f"the SSH configuration {line.where}: Include nests more than "
                              f"{MAX_INCLUDE_DEPTH} deep (a loop?); break the loop")
        for argument in line.args:
            for path in _include_paths(argument, system):
                if os.path.realpath(path) in stack:
                    raise ConfigError(f"the SSH configuration {line.where}: Include {path} "
                                      "includes itself; remove the loop")
                self.read(path, system, depth + 1, (*stack, os.path.realpath(path)))

    def _set(self, line: _Line) -> None:
        if not line.args:
            return
        if line.key == "identityfile":
            self.identity.append(line.args[0])
        elif line.key in ("proxycommand", "proxyjump"):
            self.options.setdefault("proxy", ([line.key, *line.args], line.where))
        else:
            self.options.setdefault(line.key, (line.args, line.where))

    def value(self, key: str) -> str | None:
        found = self.options.get(key)
        return found[0][0] if found else None

    def _match(self, line: _Line) -> bool:
        """Whether a ``Match`` line applies (readconf.c ``match_cfg_line``: every criterion
        must hold; one that fails stops ``exec`` from being run)."""
        args = list(line.args)
        result = True
        if not args:
            raise ConfigError(f"the SSH configuration {line.where}: Match with no criteria")
        while args:
            word = args.pop(0)
            negated = word.startswith("!")
            criterion = word[negated:].lower()
            if criterion == "all":
                continue
            if criterion in ("canonical", "final"):
                self.wants_final = self.wants_final or criterion == "final"
                hit = self.final
            elif criterion in ("host", "originalhost", "user", "localuser", "exec",
                               "localnetwork"):
                if not args:
                    raise ConfigError(f"the SSH configuration {line.where}: Match "
                                      f"{criterion} needs a value")
                value = args.pop(0)
                if criterion in ("exec", "localnetwork"):
                    if not result:
                        continue  # an earlier criterion failed: OpenSSH runs nothing
                    raise _Undecidable(
                        f"the SSH configuration {line.where}: 'Match {criterion}' decides "
                        f"whether this block applies to {self.original}, which outrig's own "
                        "reading cannot judge (it never guesses a route)")
                hit = _pattern_list_matches(self._subject(criterion), value)
            else:
                raise ConfigError(f"the SSH configuration {line.where}: outrig cannot "
                                  f"judge 'Match {criterion}'; use a Host block instead")
            if hit == negated:
                result = False
        return result

    def _subject(self, criterion: str) -> str:
        if criterion == "host":
            name = self.value("hostname")
            return name.replace("%h", self.original) if name else self.original
        if criterion == "originalhost":
            return self.original
        if criterion == "user":
            return self.value("user") or local_user()
        return local_user()


def _expand(text: str, tokens: dict[str, str], where: str, key: str) -> str:
    """``%h`` and friends in ``text``; an unknown token is refused (never passed on)."""
    def one(match: re.Match[str]) -> str:
        token = match.group(1)
        if token not in tokens:
            raise ConfigError(f"the SSH configuration {where}: {key} uses %{token}, which "
                              f"outrig does not expand (it knows "
                              f"{', '.join('%' + t for t in sorted(tokens))}); write the "
                              "value out")
        return tokens[token]
    return re.sub(r"%(.)", one, text)


def _port(text: str, where: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise ConfigError(f"the SSH configuration {where}: Port {text!r} is not a port "
                          "number from 1 to 65535")
    return int(text)


def _jump_argv(value: str, where: str) -> tuple[str, ...]:
    """ssh.c: the last hop is the one connected through; the hops before it go in ``-J``."""
    hops = value.split(",")
    last = hops[-1].removeprefix("ssh://")
    user, _, address = last.rpartition("@")
    port = ""
    if address.startswith("["):
        address, _, tail = address[1:].partition("]")
        port = tail.removeprefix(":")
    elif address.count(":") == 1:
        address, _, port = address.partition(":")
    for part in (user, address, port, *hops[:-1]):
        if part and not _SAFE.fullmatch(part):
            raise ConfigError(f"the SSH configuration {where}: ProxyJump {value!r} holds "
                              "characters a host name cannot; fix it")
    argv = ["ssh"]
    if user:
        argv += ["-l", user]
    if port:
        argv += ["-p", str(_port(port, where))]
    if hops[:-1]:
        argv += ["-J", ",".join(hops[:-1])]
    return (*argv, "-W", "[%h]:%p", address)


def _proxy_argv(reading: _Reading, hostname: str, port: int, user: str | None
                ) -> tuple[tuple[str, ...] | None, str]:
    found = reading.options.get("proxy")
    if found is None:
        return None, ""
    (key, *args), where = found
    name = "ProxyCommand" if key == "proxycommand" else "ProxyJump"
    if args[0].lower() == "none" and len(args) == 1:
        return None, ""
    for value in (hostname, user or "", reading.original):
        if value and not _SAFE.fullmatch(value):
            raise ConfigError(f"the host name or user {value!r} would enter the {name} of "
                              f"{where} as shell text; outrig refuses it (so does OpenSSH)")
    tokens = {"h": hostname, "p": str(port), "r": user or local_user(),
              "n": reading.original, "%": "%"}
    if key == "proxyjump":
        argv = _jump_argv(" ".join(args), where)
        return tuple(_expand(a, tokens, where, name) for a in argv), f"{name} in {where}"
    # OpenSSH runs it as `exec COMMAND` through the user's shell (sshconnect.c)
    command = _expand(" ".join(args), tokens, where, name)
    shell = os.environ.get("SHELL") or "/bin/sh"
    return (shell, "-c", f"exec {command}"), f"{name} in {where}"


def _read_configuration(name: str, port: int | None, user: str | None,
                        identity_file: str | None) -> _Reading:
    reading = _Reading(original=name)
    if port is not None:
        reading.options["port"] = ([str(port)], "the host file")
    if user:
        reading.options["user"] = ([user], "the host file")
    if identity_file:
        reading.identity.append(identity_file)
    for final in (False, True):
        reading.final = final
        for path, system in ((os.path.expanduser(USER_CONFIG), False), (SYSTEM_CONFIG, True)):
            reading.read(path, system, 0, (os.path.realpath(path),))
        if not reading.wants_final:
            break
    return reading


OPENSSH_G = ("ssh", "-G")  # OpenSSH's own resolution (tests add -F)


def openssh_home() -> str:
    """The home whose ``.ssh`` OpenSSH reads (the password database's; not ``HOME``)."""
    import pwd

    return pwd.getpwuid(os.getuid()).pw_dir


def _openssh_reading(name: str, port: int | None, user: str | None,
                     why: _Undecidable) -> _Reading:
    """``ssh -G NAME``'s answer, for a ``Match`` only OpenSSH can judge (``exec``,
    ``localnetwork``): one process (a few ms). Only where OpenSSH reads the same files as
    outrig (its ``~`` is the password database's home: when ``HOME`` points elsewhere, it
    would answer for another configuration) and there is an ``ssh``; else refused."""
    import shutil
    import subprocess

    client = shutil.which(OPENSSH_G[0])
    home = openssh_home()
    same = os.path.realpath(os.path.expanduser("~")) == os.path.realpath(home)
    if client is None or not same:
        because = "there is no ssh client here" if client is None else \
            f"HOME is not {home}, where ssh reads its configuration"
        raise ConfigError(f"{why} ({because}, so `ssh -G` cannot judge it either). Put a "
                          f"'Host {name}' block with the route it takes before that line "
                          f"and leave {name} out of the Match (Match host ...,!{name} ...). "
                          "Nothing was contacted.") from None
    argv = [client, *OPENSSH_G[1:], *(["-p", str(port)] if port else []),
            *(["-l", user] if user else []), "--", name]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30,
                              stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(f"{why}; `ssh -G {name}`, which judges it, failed ({exc}). "
                          "Nothing was contacted.") from None
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise ConfigError(f"{why}; `ssh -G {name}`, which judges it, refused the "
                          f"configuration: {said}. Nothing was contacted.")
    reading = _Reading(original=name)
    source = f"`ssh -G {name}`"
    for line in done.stdout.splitlines():
        key, _, value = line.partition(" ")
        if key == "identityfile":
            reading.identity.append(value)
        elif key in ("proxycommand", "proxyjump"):
            reading.options.setdefault("proxy", ([key, value], source))
        elif key in ("hostname", "port", "user", "canonicalizehostname"):
            reading.options.setdefault(key, ([value.replace("%", "%%")
                                              if key == "hostname" else value], source))
    return reading


def ssh_route(name: str, *, port: int | None = None, user: str | None = None,
              identity_file: str | None = None) -> SSHRoute:
    """Where ``ssh NAME`` (with ``-p PORT -l USER -i KEY`` when given) would connect, read from
    the SSH configuration as OpenSSH reads it (this module's docstring); no network, and no
    process unless a ``Match exec``/``localnetwork`` decides (then ``ssh -G`` judges it).
    Raises :class:`ConfigError` for what cannot be judged."""
    try:
        reading = _read_configuration(name, port, user, identity_file)
    except _Undecidable as why:
        reading = _openssh_reading(name, port, user, why)
        if identity_file:
            reading.identity.insert(0, identity_file)
    canon = reading.options.get("canonicalizehostname")
    if canon and canon[0][0].lower() not in ("no", "false"):
        raise ConfigError(f"the SSH configuration {canon[1]}: CanonicalizeHostname "
                          f"{canon[0][0]} applies to {name}, and outrig does not canonicalize "
                          "host names; set HostName to the full name instead")
    found = reading.options.get("hostname")
    hostname = name
    if found:
        hostname = _expand(found[0][0], {"h": name, "%": "%"}, found[1], "HostName")
    found = reading.options.get("port")
    number = _port(found[0][0], found[1]) if found else 22
    found = reading.options.get("user")
    login = found[0][0] if found else None
    tokens = {"h": hostname, "p": str(number), "r": login or local_user(),
              "u": local_user(), "d": os.path.expanduser("~"), "n": name, "%": "%"}
    keys = []
    for key in reading.identity:
        with contextlib.suppress(ConfigError):
            keys.append(os.path.expanduser(_expand(key, tokens, "IdentityFile", "IdentityFile")))
    proxy, source = _proxy_argv(reading, hostname, number, login)
    return SSHRoute(hostname=hostname, port=number, user=login,
                    identity_files=tuple(k for k in keys if os.path.isfile(k)),
                    proxy=proxy, proxy_source=source)


_SETTING = re.compile(r"(\w+)(?:\s*=\s*|\s+)(.+)")  # paramiko/config.py, SETTINGS_REGEX


def config_host_names(path: str | None = None) -> set[str]:
    """The concrete ``Host`` names (no wildcards, no negation) of the SSH configuration (the
    user's file and the system's, or only ``path``), their ``Include`` files followed
    (whatever block the line sits in): what an alias given to ``--host`` can be. Read as
    text, cheaply (no process, no paramiko). Lines are read as paramiko reads them (``KEY
    VALUE`` or ``KEY=VALUE``, any case, a ``Host`` line's names split as a shell splits
    words), and a line that does not parse makes that file give no names (ssh refuses such a
    file)."""
    if path is not None:
        return _names_in(path, False, 0)
    return _names_in(os.path.expanduser(USER_CONFIG), False, 0) | \
        _names_in(SYSTEM_CONFIG, True, 0)


def _names_in(path: str, system: bool, depth: int) -> set[str]:
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except (OSError, UnicodeDecodeError):
        return set()
    names: set[str] = set()
    included: set[str] = set()
    for raw in text.split("\n"):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _SETTING.match(line)
        if match is None:
            return set()
        key = match.group(1).lower()
        if key not in ("host", "include"):
            continue
        try:
            words = shlex.split(match.group(2))
        except ValueError:
            return set()
        if key == "host":
            names.update(w for w in words if not any(c in w for c in "*?!"))
        elif depth < MAX_INCLUDE_DEPTH:
            for argument in words:
                for found in _include_paths(argument, system):
                    included |= _names_in(found, system, depth + 1)
    return names | included


def quoted(argv: tuple[str, ...]) -> str:
    """An argv as one line for messages."""
    return shlex.join(argv)
