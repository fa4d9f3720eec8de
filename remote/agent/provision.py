"""The ``provision`` op: make the playbook's Python environments exist with their pinned
versions, after checking python, driver and disk against ``requires`` (docs/provision.md).

Finding out what is already right costs one subprocess per environment (its interpreter lists
what it has installed), so a re-run on a provisioned box is one exec and a fraction of a
second. What this module leans on, each in the module of its concept: the pins and version
checks (:mod:`.versions`), the box's own requirements (:mod:`.requires`), running installer
children with their output streamed as ``progress`` events (:mod:`.children`), whether the
package index answers (:mod:`.reach`), and the choice of uv or pip (:mod:`.installers`).
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import time
import urllib.parse
from typing import Any, Dict, List, Optional, Tuple

from .children import classify_child_failure, probe_json, run_streaming
from .constants import EXCERPT_LINES, JSONDict
from .events import AgentError, Emitter, bad_request
from .gpus import gather_facts
from .installers import (
    INSTALLERS,
    Unsupported,
    bootstrap_commands,
    bootstrap_paths,
    find_uv,
    pip_settings,
    public_url,
    translate_pip_args,
    url_secrets,
    uv_error_line,
    uv_install_argv,
    uv_missing,
    uv_runs,
)
from .layout import Layout
from .lock import FileLock
from .reach import hub_reachable
from .requires import check_disk, check_driver, parse_requires
from .validation import (
    Request,
    get_bool,
    get_name,
    get_num,
    get_opt_str,
    get_str,
    get_str_dict,
    get_str_list,
)
from .versions import parse_requirement, version_satisfies

PROVISION_LOCK_DEFAULT_S = 30.0


# What the environment's own interpreter says it has: every installed distribution (first on
# sys.path wins, as for import), its version, and whether pip is there. Python 3.8+.
ENV_CHECK_SCRIPT = r"""
import json, re, sys
import importlib.util
packages = {}
try:
    from importlib import metadata
    for dist in metadata.distributions():
        try:
            name = dist.metadata["Name"]
        except Exception:
            name = None
        if name:
            packages.setdefault(re.sub(r"[-_.]+", "-", name).lower(), dist.version)
except ImportError:
    pass
print(json.dumps({"python": "%d.%d.%d" % sys.version_info[:3], "packages": packages,
                  "pip": importlib.util.find_spec("pip") is not None}))
"""
# The base interpreter a venv would be made from: its version, and whether ``-m venv`` can work
# (Debian and Ubuntu ship ensurepip separately, in python3-venv / python3.X-venv).
BASE_PROBE_SCRIPT = r"""
import json, sys
try:
    import venv, ensurepip
    ok = True
except ImportError:
    ok = False
print(json.dumps({"python": "%d.%d.%d" % sys.version_info[:3],
                  "short": "%d.%d" % sys.version_info[:2], "venv": ok}))
"""


class EnvSpec:
    """One environment of a provision request, validated."""

    def __init__(self, raw: Any, index: int) -> None:
        where = f"environments[{index}]."
        if not isinstance(raw, dict):
            raise bad_request(f"environments[{index}]: must be an object")
        self.name = get_name(raw, "name", where)
        path = os.path.expanduser(get_str(raw, "path", where))
        if not os.path.isabs(path) or "\0" in path:
            raise bad_request(f"{where}path: {path!r} must be an absolute path (or start with ~)")
        self.path = os.path.normpath(path)
        self.python = get_opt_str(raw, "python", where) or "python3"
        self.packages = [parse_requirement(p, f"{where}packages")
                         for p in get_str_list(raw, "packages", where)]
        self.index_url = get_opt_str(raw, "index_url", where)
        self.extra_index_urls = get_str_list(raw, "extra_index_urls", where)
        self.find_links = get_str_list(raw, "find_links", where)
        self.no_index = get_bool(raw, "no_index", where, False)
        self.pip_args = get_str_list(raw, "pip_args", where)
        self.installer = get_opt_str(raw, "installer", where) or "auto"
        if self.installer not in INSTALLERS:
            raise bad_request(f"{where}installer: {self.installer!r} is not one of "
                              f"{', '.join(INSTALLERS)}")

    @property
    def env_python(self) -> str:
        """The environment's own interpreter."""
        return os.path.join(self.path, "bin", "python")

    @property
    def secrets(self) -> List[str]:
        """Credentials inside this environment's index URLs (redacted from all output)."""
        return url_secrets([self.index_url, *self.extra_index_urls])

    def pip_env(self) -> Dict[str, str]:
        """The index URLs for pip, as variables: they may carry a token, and argv is visible
        to every user of the box (``ps``). ``PIP_EXTRA_INDEX_URL`` replaces what pip's config
        says, where ``--extra-index-url`` would add to it, so the config's come first."""
        env: Dict[str, str] = {}
        if self.index_url:
            env["PIP_INDEX_URL"] = self.index_url
        if self.extra_index_urls:
            configured = pip_settings(dict(os.environ), self.path).extra_index_urls
            env["PIP_EXTRA_INDEX_URL"] = " ".join([*configured, *self.extra_index_urls])
        return env

    def pip_argv(self) -> List[str]:
        """``pip install`` with this environment's index options (the URLs go by
        :meth:`pip_env`) and every package."""
        argv = [self.env_python, "-m", "pip", "install", "--disable-pip-version-check",
                "--no-input"]
        for link in self.find_links:
            argv += ["--find-links", link]
        if self.no_index:
            argv.append("--no-index")
        return argv + self.pip_args + [p.text for p in self.packages]


def inspect_env(env: EnvSpec) -> JSONDict:
    """What the environment has now: {exists, python, pip, versions, wrong: {pkg: have|None},
    error}. One subprocess (the environment's interpreter), none when it does not exist."""
    state: JSONDict = {"exists": False, "python": None, "pip": False, "versions": {},
                       "wrong": {}, "error": None}
    if not os.path.exists(env.env_python):
        state["wrong"] = {p.name: None for p in env.packages}
        return state
    state["exists"] = True
    data, why = probe_json([env.env_python, "-c", ENV_CHECK_SCRIPT])
    if data is None:
        state["error"] = why
        state["wrong"] = {p.name: None for p in env.packages}
        return state
    listed = data.get("packages")
    installed: JSONDict = listed if isinstance(listed, dict) else {}
    state["python"] = data.get("python")
    state["pip"] = bool(data.get("pip"))
    for req in env.packages:
        have = installed.get(req.name)
        if isinstance(have, str):
            state["versions"][req.name] = have
        good = isinstance(have, str) and (not req.spec or version_satisfies(have, req.spec) is True)
        if not good:
            state["wrong"][req.name] = have if isinstance(have, str) else None
    return state


def python_error(env: EnvSpec, message: str) -> AgentError:
    """A ``python`` error for one environment."""
    return AgentError("python", f"environment {env.name}: {message}", process=env.name)


def check_base_python(env: EnvSpec, spec: Optional[str]) -> JSONDict:
    """The interpreter a new venv is made from: it must run, meet ``requires.python`` and have
    a working venv module."""
    exe = env.python if os.sep in env.python else shutil.which(env.python)
    if exe is None or not os.path.exists(exe):
        raise python_error(env, f"no interpreter {env.python!r} on the box; install it "
                                "(e.g. apt-get install -y python3.12 python3.12-venv) or set "
                                f"environments.{env.name}.python to one that exists")
    data, why = probe_json([exe, "-c", BASE_PROBE_SCRIPT])
    if data is None:
        raise python_error(env, f"{env.python} does not run: {why}")
    version = str(data.get("python"))
    if spec is not None and version_satisfies(version, spec) is not True:
        raise python_error(env, f"{env.python} is Python {version}, the playbook requires "
                                f"{spec} (requires.python); install a newer Python (e.g. "
                                f"apt-get install -y python3.12 python3.12-venv) and set "
                                f"environments.{env.name}.python to it")
    if not data.get("venv"):
        short = data.get("short") or "3"
        raise python_error(env, f"{env.python} (Python {version}) cannot create virtual "
                                f"environments: its ensurepip/venv module is missing. On "
                                f"Debian/Ubuntu: apt-get install -y python{short}-venv "
                                "(or python3-venv)")
    return {"python": version, "executable": exe}


class PathLock(FileLock):
    """An flock on ``<dir>/.<name>.outrig-lock`` beside an environment, so two provisions never
    pip-install into the same venv at once (pip would corrupt it)."""

    def __init__(self, path: str, timeout: float) -> None:
        parent, base = os.path.split(path)
        super().__init__(os.path.join(parent, f".{base}.outrig-lock"), "provision", timeout,
                         "another provision is installing here; let it finish, then run "
                         "provision again")


def unreachable_index(env: EnvSpec) -> Optional[str]:
    """Why the environment's main package index cannot be reached (TCP connect, 5 s), or None.

    pip reports a refused or unresolvable index only at debug level when it does not retry
    (``--retries 0``), and then says just "No matching distribution", so a failed install asks
    the network directly before blaming the pins."""
    if env.no_index:
        return None
    url = env.index_url or os.environ.get("PIP_INDEX_URL") or "https://pypi.org/simple"
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        return None
    try:
        port = parsed.port or (80 if parsed.scheme == "http" else 443)
    except ValueError:
        return None
    ok, why = hub_reachable(parsed.hostname, port)
    return None if ok else why


def pip_failure(env: EnvSpec, code: int, lines: List[str], installer: str = "pip") -> AgentError:
    """Why pip (or ``uv pip``) failed, as ``no_internet``, ``disk`` or ``pip``, with a fix."""
    excerpt = lines[-EXCERPT_LINES:]
    kind = classify_child_failure(lines)
    offline = unreachable_index(env) if kind is None else None
    if offline is not None:
        kind = "no_internet"
        excerpt = [*excerpt, f"(outrig: cannot connect to the index: {offline})"]
    where = public_url(env.index_url) if env.index_url else (
        "find_links only" if env.no_index else "PyPI")
    if kind == "disk":
        return AgentError("disk", f"environment {env.name}: the disk filled up while {installer} "
                                  f"installed into {env.path}; free space and run provision "
                                  f"again ({installer} resumes with what is already there)",
                          process=env.name, excerpt=excerpt, exit_code=code)
    if kind == "no_internet":
        return AgentError("no_internet", f"environment {env.name}: {installer} cannot reach the "
                                         f"package index ({where}) from the box. Check the box's "
                                         "network (DNS, proxy: set HTTPS_PROXY in the host file's "
                                         "env:), or point index_url at a reachable mirror, or "
                                         "pre-build wheels and use find_links + no_index: true",
                          process=env.name, excerpt=excerpt, exit_code=code)
    missing = uv_missing(lines)
    for line in lines:
        match = re.search(r"No matching distribution found for (\S+)", line)
        if match and match.group(1) not in missing:
            missing.append(match.group(1))
    if missing:
        hint = (f"it is not in find_links ({', '.join(env.find_links) or 'none'}) and no_index "
                "is set" if env.no_index else f"the index ({where}) has no such version")
        return AgentError("pip", f"environment {env.name}: {installer} found no distribution "
                                 f"for {', '.join(missing)}: {hint}. Check the name and the pin, "
                                 "or add the index/wheel that has it",
                          process=env.name, excerpt=excerpt, exit_code=code)
    return AgentError("pip", f"environment {env.name}: {installer} install into {env.path} "
                             f"failed (exit {code}); see its last lines below", process=env.name,
                      excerpt=excerpt, exit_code=code)


class Installing:
    """What one environment's install needs besides the environment: where the bootstrap venv
    lives, the progress settings, the child's environment and the values to redact."""

    def __init__(self, state_dir: str, out: Emitter, interval: float, lock_timeout: float,
                 child_env: Dict[str, str], secrets: List[str]) -> None:
        self.state_dir = state_dir
        self.out = out
        self.interval = interval
        self.lock_timeout = lock_timeout
        self.child_env = child_env
        self.secrets = secrets
        self.bootstrap_seconds: Optional[float] = None

    def run(self, env: EnvSpec, argv: List[str], phase: str,
            extra_env: Optional[Dict[str, str]] = None) -> Tuple[int, List[str]]:
        """One installer child, streamed as ``progress`` events of ``phase``."""
        child = dict(self.child_env)
        child.update(extra_env or {})
        return run_streaming(argv, self.out, self.interval, {"env": env.name, "phase": phase},
                             env=child, secrets=[*self.secrets, *env.secrets])


def bootstrap_uv(env: EnvSpec, ctx: Installing) -> Tuple[Optional[str], str]:
    """Make the bootstrap venv with uv in it (once per box; reused after): (uv, "") or (None,
    why not). Under a lock, so two provisions never build it at once."""
    venv = bootstrap_paths(ctx.state_dir)[0]
    lock = FileLock(os.path.join(ctx.state_dir, "uv-bootstrap.lock"), "provision",
                    ctx.lock_timeout, "another provision is installing uv; let it finish")
    try:
        with lock:
            made = bootstrap_paths(ctx.state_dir)[2]
            if os.path.exists(made) and uv_runs(made):
                return made, ""  # another provision made it while this one waited
            make, install, index_env = bootstrap_commands(
                ctx.state_dir, index_url=env.index_url, extra_index_urls=env.extra_index_urls,
                find_links=env.find_links, no_index=env.no_index)
            ctx.out.step(f"{env.name}: installing uv into {venv} (once per box)")
            if make is not None:
                code, lines = ctx.run(env, make, "uv-bootstrap")
                if code != 0:
                    # a half-made venv (no pip: ensurepip missing) would be taken as made
                    shutil.rmtree(venv, ignore_errors=True)
                    return None, (f"making the bootstrap venv {venv} failed (exit {code}): "
                                  f"{lines[-1] if lines else 'no output'}")
            code, lines = ctx.run(env, install, "uv-bootstrap", index_env)
            if code != 0:
                return None, (f"pip install uv into {venv} failed (exit {code}): "
                              f"{lines[-1] if lines else 'no output'}")
    except AgentError as exc:
        return None, exc.message
    uv = bootstrap_paths(ctx.state_dir)[2]
    if not uv_runs(uv):
        return None, f"{uv} was installed but does not run"
    return uv, ""


def plan_uv(env: EnvSpec, ctx: Installing) -> Tuple[Optional[List[str]], Dict[str, str], str]:
    """The ``uv pip install`` command for this environment: (argv, its variables, where uv
    came from) or (None, {}, why uv cannot be used). The bootstrap's seconds, when it ran,
    go to ``ctx.bootstrap_seconds``."""
    try:
        translate_pip_args(env.pip_args)
    except Unsupported as exc:
        return None, {}, str(exc)
    uv, source = find_uv(ctx.state_dir, ctx.child_env)
    if uv is None:
        started = time.monotonic()
        uv, why = bootstrap_uv(env, ctx)
        ctx.bootstrap_seconds = round(time.monotonic() - started, 2)
        if uv is None:
            return None, {}, f"uv is not on PATH and cannot be installed: {why}"
        source = "bootstrapped"
    argv, extra = uv_install_argv(
        uv, env.env_python, [p.text for p in env.packages], index_url=env.index_url,
        extra_index_urls=env.extra_index_urls, find_links=env.find_links,
        no_index=env.no_index, pip_args=env.pip_args, environ=ctx.child_env,
        site_prefix=env.path)
    return argv, extra, source


def install_packages(env: EnvSpec, ctx: Installing) -> JSONDict:
    """Install every package with uv where it can, else pip: {installer, fallback}.

    ``installer: auto`` falls back to pip when uv cannot be had or fails in a way pip might
    not (a resolver or build difference); a full disk or an unreachable index is an error at
    once, as pip would meet the same. ``installer: uv`` never falls back."""
    reason = "installer: pip is set"
    if env.installer != "pip":
        argv, extra, source = plan_uv(env, ctx)
        if argv is None:
            if env.installer == "uv":
                raise AgentError("pip", f"environment {env.name}: installer: uv is set, but "
                                        f"{source}. Put uv on the box's PATH, or let the index "
                                        "offer it, or set installer: auto to fall back to pip",
                                 process=env.name)
            reason = source
        else:
            ctx.out.emit("installer", env=env.name, installer="uv", uv=argv[0], source=source,
                         bootstrap_seconds=ctx.bootstrap_seconds)
            ctx.out.step(f"{env.name}: uv pip install {len(env.packages)} package(s)")
            code, lines = ctx.run(env, argv, "uv", extra)
            if code == 0:
                return {"installer": "uv", "fallback": None}
            failure = pip_failure(env, code, lines, installer="uv")
            if env.installer == "uv" or failure.kind in ("disk", "no_internet"):
                raise failure
            reason = f"uv pip install failed (exit {code}): {uv_error_line(lines)}"
    if env.installer == "auto":
        ctx.out.emit("installer", env=env.name, installer="pip", fallback=reason)
    else:
        ctx.out.emit("installer", env=env.name, installer="pip", fallback=None)
    code, lines = ctx.run(env, env.pip_argv(), "pip", env.pip_env())
    if code != 0:
        raise pip_failure(env, code, lines)
    return {"installer": "pip", "fallback": reason if env.installer == "auto" else None}


def provision_env(env: EnvSpec, requires: JSONDict, out: Emitter, interval: float,
                  dry_run: bool, lock_timeout: float, state_dir: str = "",
                  secrets: Optional[List[str]] = None) -> JSONDict:
    """Check one environment; create or update it unless it is already right."""
    started = time.monotonic()
    state = inspect_env(env)
    report: JSONDict = {"name": env.name, "path": env.path, "python": state["python"],
                        "versions": dict(state["versions"]), "seconds": 0.0,
                        "missing": dict(state["wrong"]), "installer": None,
                        "fallback": None}
    if state["error"] is not None:
        raise python_error(env, f"the venv at {env.path} is broken ({state['error']}); remove "
                                f"it (rm -rf {env.path}) and run provision again")
    if (requires.get("python") and state["exists"]
            and version_satisfies(str(state["python"]), requires["python"]) is not True):
            raise python_error(env, f"the venv at {env.path} runs Python {state['python']}, the "
                                    f"playbook requires {requires['python']}; remove it (rm -rf "
                                    f"{env.path}), set environments.{env.name}.python to a "
                                    "newer interpreter and run provision again")
    if not state["wrong"] and state["exists"]:
        report["status"] = "ok"
        report["seconds"] = round(time.monotonic() - started, 2)
        return report
    if dry_run:
        if not state["exists"]:
            report["base"] = check_base_python(env, requires.get("python"))
        report["status"] = "would_update" if state["exists"] else "would_create"
        report["seconds"] = round(time.monotonic() - started, 2)
        return report
    fields: JSONDict = {"env": env.name}
    child_env = dict(os.environ)
    child_env.update({"PIP_NO_INPUT": "1", "PYTHONUNBUFFERED": "1",
                      "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    child_env.pop("PYTHONHOME", None)
    with PathLock(env.path, lock_timeout):
        state = inspect_env(env)  # someone may have finished it while we waited for the lock
        created = not state["exists"]
        if created:
            base = check_base_python(env, requires.get("python"))
            out.step(f"{env.name}: creating venv {env.path} (Python {base['python']})")
            code, lines = run_streaming([base["executable"], "-m", "venv", env.path], out,
                                        interval, {**fields, "phase": "venv"}, env=child_env)
            if code != 0:
                if classify_child_failure(lines) == "disk":
                    raise AgentError("disk", f"environment {env.name}: no space left creating "
                                             f"{env.path}; free space and run provision again",
                                     process=env.name, excerpt=lines[-EXCERPT_LINES:])
                text = "\n".join(lines)
                if "ensurepip" in text:
                    raise python_error(env, f"{env.python} cannot create virtual environments "
                                            "(ensurepip is missing). On Debian/Ubuntu: apt-get "
                                            "install -y python3-venv (or python3.X-venv)")
                raise AgentError("python", f"environment {env.name}: '{env.python} -m venv "
                                           f"{env.path}' failed (exit {code})",
                                 process=env.name, excerpt=lines[-EXCERPT_LINES:],
                                 exit_code=code)
        if state["wrong"] or created:
            wrong = ", ".join(f"{n} ({v or 'missing'})" for n, v in sorted(state["wrong"].items()))
            out.step(f"{env.name}: install {len(env.packages)} package(s)"
                     + (f"; needed: {wrong}" if wrong and not created else ""))
            if env.packages:
                ctx = Installing(state_dir or os.path.join(os.path.dirname(env.path), ".outrig"),
                                 out, interval, lock_timeout, child_env, secrets or [])
                install_started = time.monotonic()
                report.update(install_packages(env, ctx))
                report["install_seconds"] = round(time.monotonic() - install_started, 2)
            state = inspect_env(env)
            if state["wrong"]:
                bad = ", ".join(f"{n} is {v or 'not installed'}"
                                for n, v in sorted(state["wrong"].items()))
                raise AgentError("pip", f"environment {env.name}: {report.get('installer')} "
                                        f"finished but {bad}, not "
                                        "what the playbook pins; another requirement may pull a "
                                        "different version (see pip's resolver output with "
                                        "--dry-run locally) — align the pins",
                                 process=env.name)
    report.update(status="created" if created else "updated", python=state["python"],
                  versions=dict(state["versions"]), missing={},
                  seconds=round(time.monotonic() - started, 2))
    return report


def op_provision(req: Request, out: Emitter) -> JSONDict:
    """Check python/driver/disk against ``requires``; make every environment right."""
    raw = req.raw
    envs_raw = raw.get("environments") or []
    if not isinstance(envs_raw, list):
        raise bad_request("environments: must be a list")
    envs = [EnvSpec(e, i) for i, e in enumerate(envs_raw)]
    names = [e.name for e in envs]
    if len(set(names)) != len(names):
        raise bad_request("environments: names must be unique")
    requires = parse_requires(raw)
    dry_run = get_bool(raw, "dry_run", "", False)
    interval = get_num(raw, "progress_interval", "", 1.0, positive=True)
    lock_timeout = get_num(raw, "lock_timeout", "", PROVISION_LOCK_DEFAULT_S)
    secrets = [v for v in get_str_dict(raw, "secrets", "").values() if v]
    facts = gather_facts()
    out.emit("facts", **facts)
    checks: JSONDict = {"python": {"agent": platform.python_version(),
                                   "required": requires["python"]}}
    if (requires["python"] and not envs
            and version_satisfies(platform.python_version(), requires["python"]) is not True):
            raise AgentError("python", f"the box's Python is {platform.python_version()}, the "
                                       f"playbook requires {requires['python']}; install a newer "
                                       "Python or set python: in the host file")
    checks["driver"] = check_driver(requires["driver"], facts["gpus"], facts["gpu_error"])
    checks["disk"] = check_disk([req.workdir, *[e.path for e in envs]], requires["disk_gb"])
    reports: List[JSONDict] = []
    for env in envs:
        try:
            report = provision_env(env, requires, out, interval, dry_run, lock_timeout,
                                   Layout(req.workdir).state, secrets)
        except AgentError as exc:
            out.emit("environment", name=env.name, path=env.path, status="failed",
                     versions={}, seconds=None, error=exc.kind)
            raise
        out.emit("environment", **report)
        reports.append(report)
    return {"dry_run": dry_run, "checks": checks, "environments": reports}
