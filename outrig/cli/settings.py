"""Where a command's project and defaults come from: the project folder (found upward, or
named), its ``outrig.yaml`` / ``invoke.yaml``, ``OUTRIG_*`` variables and Invoke's own config.

Precedence, highest first: the flag, an ``OUTRIG_*`` variable, the project's ``outrig.yaml``,
its ``invoke.yaml``, then the user's configuration (docs/cli.md). Pure reading; nothing here
reaches a box.

:mod:`outrig.cli.invoke_program` reads :data:`~outrig.formats.project_file.SETTINGS` and
:func:`~outrig.formats.project_file.find_project` on every start, so the
session layer (and through it the transports) is imported only where settings are made
(:func:`_settings`), purely for start-up; the reporter is a type here only. The task modules
import it too, and ``outrig --list`` imports them (:mod:`outrig.cli.launcher`), so YAML is
imported where a file or a ``--param`` value is read, also purely for start-up.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from outrig.errors import ConfigError
from outrig.formats.project_file import (
    PROJECT_FILE,
    PROJECT_FILES,
    find_project,
    read_project_config,
    read_project_file,
)

if TYPE_CHECKING:
    from outrig.cli.taskspec import TaskContext
    from outrig.console import Reporter
    from outrig.inventory import Host
    from outrig.session import Project

def _invoke_setting(c: TaskContext | None, key: str) -> str | None:
    """``key`` from Invoke's merged config (user/system files, collection defaults)."""
    if c is None:  # called without Invoke (the sandbox, a test)
        return None
    config = c.config
    try:
        value = config.get(key)
    except (AttributeError, KeyError):
        return None
    return str(value) if value not in (None, "") else None


@dataclass
class Settings:
    """The project of this command and where its defaults come from."""

    project: Project
    project_source: str
    file: dict[str, tuple[str, Path]] = field(default_factory=dict)
    context: TaskContext | None = None

    def value(self, key: str, flag: str | None) -> tuple[str | None, str]:
        """``key``'s value and where it came from: flag > env > project files > Invoke
        config."""
        if flag not in (None, ""):
            return flag, f"--{key}"
        variable = f"OUTRIG_{key.upper()}"
        if os.environ.get(variable):
            return os.environ[variable], variable
        if key in self.file:
            value, path = self.file[key]
            return value, f"{key}: in {path}"
        configured = _invoke_setting(self.context, key)
        if configured:
            return configured, f"{key}: in the user configuration"
        return None, ""

    def keep_seconds(self) -> float | None:
        """``keep_seconds:`` (how long a warm connection waits idle; 0: none) from the
        project's files, else the user configuration; ``None`` when set nowhere."""
        for name in PROJECT_FILES:
            data = read_project_file(self.project.root, name)
            if data.get("keep_seconds") is not None:
                return _seconds(data["keep_seconds"], f"{self.project.root / name}")
        configured = _invoke_setting(self.context, "keep_seconds")
        return None if configured is None else _seconds(configured, "the user configuration")

    def command_keep_seconds(self, no_keep: bool) -> float | None:
        """The warm-connection setting of a command that reaches a box: 0 with
        ``--no-keep``; else ``OUTRIG_KEEP_SECONDS``; else ``keep_seconds:`` in the project's
        files or the user configuration; ``None`` when set nowhere (then the host file's
        ``keep_seconds:``, else 10 minutes)."""
        if no_keep:
            return 0.0
        from outrig.connectors.keeper.connections import env_keep_seconds

        from_env = env_keep_seconds()
        return from_env if from_env is not None else self.keep_seconds()

    def on_event(self) -> list[str] | None:
        """The ``on_event`` hook's argv (docs/watch.md#notifications): ``OUTRIG_ON_EVENT``,
        else ``on_event:`` in the project's files, else the user configuration; ``None`` when
        set nowhere (then nothing is sent anywhere)."""
        from outrig.watching.notify import hook_argv

        if os.environ.get("OUTRIG_ON_EVENT"):
            return hook_argv(os.environ["OUTRIG_ON_EVENT"], "OUTRIG_ON_EVENT")
        for name in PROJECT_FILES:
            data = read_project_file(self.project.root, name)
            if data.get("on_event") is not None:
                return hook_argv(data["on_event"], str(self.project.root / name))
        config = getattr(self.context, "config", None)
        try:
            configured = config.get("on_event") if config is not None else None
        except (AttributeError, KeyError):
            configured = None
        return hook_argv(configured, "the user configuration")

    def host(self, flag: str | None) -> str:
        """The host to act on; a clear ConfigError (exit 2) when none is given anywhere."""
        value, _ = self.value("host", flag)
        if value is None:
            raise ConfigError(
                "no host given: pass --host NAME (a file in "
                f"{self.project.hosts_dir}, an ~/.ssh/config alias, user@host:port or "
                f"'local'), or set a default with host: in {self.project.root / PROJECT_FILE} "
                "or the OUTRIG_HOST variable. Nothing was sent.")
        from outrig.hostgroups import names_several

        if names_several(value, self.project.hosts_dir):
            raise ConfigError(
                f"--host {value} names several hosts (a list, a group or 'all'); this "
                "command runs on one host: pass one host here. "
                "Nothing was sent.")
        return value

    def hosts(self, flags: list[str] | str | None, *,
              book: Callable[[str], Host] | None = None) -> list[str]:
        """The hosts a command that runs on several at once acts on: every ``--host`` value
        (repeated, comma-separated, groups, ``all``; see :mod:`outrig.hostgroups`), else the
        configured host (which may be a group too). Checked before anything is sent, each
        host through ``book`` (the command's target's, which then has it resolved)."""
        from outrig.hostgroups import expand_hosts

        values = [flags] if isinstance(flags, str) else [v for v in flags or [] if v]
        if not values:
            values = [self.host_value()]
        return expand_hosts(values, self.project.hosts_dir, book=book)

    def host_value(self) -> str:
        """The configured ``--host`` value as given (a host, a list or a group)."""
        value, _ = self.value("host", None)
        if value is None:
            self.host(None)  # raises the "no host given" error
        return str(value)


def _seconds(value: Any, where: str) -> float:
    """A ``keep_seconds:`` value: a number ≥ 0, else a ConfigError naming where it is set."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = -1.0
    if isinstance(value, bool) or seconds < 0:
        raise ConfigError(f"{where}: keep_seconds: must be a number of seconds ≥ 0 (0 turns "
                          f"the warm connection off), not {value!r}")
    return seconds


def settings_for(c: TaskContext | None, project_flag: str | None, *,
                 no_keep: bool | None = None) -> Settings:
    """The project: --project, OUTRIG_PROJECT, found upward from here, the configured
    ``project``, else this folder (host aliases and paths still work there).

    ``no_keep``: a task that reaches a box passes its ``--no-keep`` (True or False), and
    the project then carries the command's warm-connection setting
    (:meth:`Settings.command_keep_seconds`) to every connector the command opens; ``None``
    (a task that opens none through a connector) leaves it unset."""
    settings = _find_settings(c, project_flag)
    if no_keep is not None:
        settings.project.keep_seconds = settings.command_keep_seconds(no_keep)
    return settings


def _find_settings(c: TaskContext | None, project_flag: str | None) -> Settings:
    """The project's folder, where it was found, and its config files."""
    explicit = project_flag or os.environ.get("OUTRIG_PROJECT")
    source = "--project" if project_flag else "OUTRIG_PROJECT"
    if explicit:
        root = Path(explicit).expanduser()
        if not root.is_dir():
            raise ConfigError(f"{source} {explicit}: no such folder; name the folder that "
                              "holds hosts/ and playbooks/ (outrig init makes one)")
        return _settings(c, root.resolve(), source)
    found = find_project(Path.cwd())
    if found is not None:
        return _settings(c, found, "found upward from the current folder")
    configured = _invoke_setting(c, "project")
    if configured and Path(configured).expanduser().is_dir():
        return _settings(c, Path(configured).expanduser().resolve(), "project: in the config")
    return _settings(c, Path.cwd().resolve(), "the current folder (no project found)")


def _settings(c: TaskContext | None, root: Path, source: str) -> Settings:
    from outrig.session import Project

    return Settings(Project(root), source, read_project_config(root), c)


def playbook_for(settings: Settings, flag: str | None, host: str | None,
                 reporter: Reporter, *, what: str,
                 book: Callable[[str], Host] | None = None) -> str:
    """The playbook to plan or deploy: flag > env > config > the host's current run's
    playbook. Never a built-in default: deploying something the user did not name is worse
    than asking. ``book``: the command's hosts, resolved once (its target's)."""
    value, source = settings.value("playbook", flag)
    if value is not None:
        if source != "--playbook":
            reporter.info(f"playbook {value} ({source})")
        return value
    running: list[dict[str, Any]] = []
    if host is not None:
        from outrig.inventory import HostBook
        from outrig.journal import Journal

        name = (book or HostBook(settings.project.hosts_dir))(host).name
        running = [r for r in Journal().runs(host=name) if r.get("status") == "running"]
    playbooks = sorted({str(r.get("playbook")) for r in running})
    if len(playbooks) == 1:
        reporter.info(f"playbook {playbooks[0]} (the current run on {host}, "
                      f"{running[0].get('run_id')})")
        return playbooks[0]
    folder = settings.project.playbooks_dir
    known = sorted(p.stem for p in folder.glob("*.y*ml")) if folder.is_dir() else []
    why = (f"runs of {len(playbooks)} playbooks are running on {host} ({', '.join(playbooks)})"
           if playbooks else f"{host} has no current run to take it from")
    raise ConfigError(
        f"which playbook to {what}? none was given or configured and {why}: pass --playbook "
        f"NAME (in {folder}: {', '.join(known) or 'none'}), or set playbook: in "
        f"{settings.project.root / PROJECT_FILE} or OUTRIG_PLAYBOOK. Nothing was sent.")


def parse_params(values: list[str] | None) -> dict[str, Any]:
    """``--param key=value`` flags as a mapping; each value is read as YAML (``5`` is a
    number, ``true`` a boolean, anything else text), like the playbook's own params."""
    import yaml

    params: dict[str, Any] = {}
    for item in values or []:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--param {item!r}: expected key=value, e.g. --param steps=5")
        try:
            params[key.strip()] = yaml.safe_load(raw) if raw.strip() else raw
        except yaml.YAMLError:
            params[key.strip()] = raw
    return params
