"""The ``provision`` op: make the playbook's Python environments exist with their pinned
versions and check python, driver and disk against ``requires`` (docs/provision.md)."""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import socket
import subprocess
import time
import urllib.parse
from typing import Any, Dict, List, NamedTuple, Optional, Set, Tuple

from .constants import EXCERPT_LINES, JSONDict
from .events import AgentError, Emitter, bad_request
from .gpus import gather_facts
from .installers import (
    INSTALLERS,
    UV_NO_INTERNET_PATTERNS,
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
from .layout import Layout, nearest_existing
from .lock import FileLock
from .logs import clean_line
from .validation import (
    Request,
    get_bool,
    get_dict,
    get_name,
    get_num,
    get_opt_str,
    get_str,
    get_str_dict,
    get_str_list,
)

#
# ``op: provision`` makes the playbook's Python environments exist on the box with their pinned
# versions, and checks python, driver and disk against the playbook's ``requires:``. Finding out
# what is already right costs one subprocess per environment (its interpreter lists what it has
# installed), so a re-run on a provisioned box is one exec and a fraction of a second.
# ``op: hub_download`` makes the box fetch a model or data set from the hub itself (with the HF
# token from ``secrets`` in the child's environment only), so 50 GB never cross the slow link.
# Both stream child output as throttled ``progress`` events (docs/provision.md).

VERSION_CLAUSE_RE = re.compile(r"^(===|==|!=|~=|>=|<=|>|<)\s*([A-Za-z0-9.*+!_-]+)$")
REQUIREMENT_RE = re.compile(
    r"^\s*([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)\s*(\[[^\]]*\])?\s*(.*)$")
HUB_REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")
CHILD_EXCERPT_KEEP = 200  # lines of child output kept for error classification
PROVISION_LOCK_DEFAULT_S = 30.0
HUB_CONNECT_TIMEOUT_S = 5.0


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


NO_INTERNET_PATTERNS = (
    "Failed to establish a new connection",
    "Temporary failure in name resolution",
    "Name or service not known",
    "nodename nor servname",
    "Network is unreachable",
    "No route to host",
    "Connection refused",
    "ConnectTimeoutError",
    "Connection timed out",
    "Max retries exceeded",
    "connection broken by",
    "Could not fetch URL",
    "Read timed out",
    "ProxyError",
    "ConnectionError",
    "We couldn't connect to",
    "OfflineModeIsEnabled",
    *UV_NO_INTERNET_PATTERNS,
)
DISK_PATTERNS = ("No space left on device", "[Errno 28]", "Disk quota exceeded")


def version_key(text: str) -> Optional[Tuple[Tuple[int, ...], int, str]]:
    """An orderable key for a version string: release numbers (trailing zeros dropped), then
    pre-release (-1) < final (0) < post (1), then the rest. A local label (``+cu130``) is
    dropped. Good enough for pins and driver/python versions; not full PEP 440."""
    public = text.strip().lower().split("+", 1)[0]
    if public.startswith("v"):
        public = public[1:]
    match = re.match(r"^(\d+(?:\.\d+)*)(.*)$", public)
    if match is None:
        return None
    release = [int(x) for x in match.group(1).split(".")]
    while len(release) > 1 and release[-1] == 0:
        release.pop()
    rest = match.group(2).lstrip(".-_")
    tag = 0 if not rest else (1 if rest.startswith(("post", "rev")) else -1)
    return tuple(release), tag, rest


def version_satisfies(version: str, spec: str) -> Optional[bool]:
    """Whether ``version`` meets ``spec`` (``>=3.10``, ``==0.33.0``, ``>=1,<2``, ``==2.*``);
    None when either cannot be read."""
    have = version_key(version)
    if have is None:
        return None
    for clause in [c.strip() for c in spec.split(",") if c.strip()]:
        match = VERSION_CLAUSE_RE.match(clause)
        if match is None:
            return None
        op, want_text = match.group(1), match.group(2)
        if op == "===":
            if version.strip() != want_text:
                return False
            continue
        if want_text.endswith(".*"):
            parts = want_text[:-2].split(".")
            if op not in ("==", "!=") or not all(x.isdigit() for x in parts):
                return None
            want_rel = [int(x) for x in parts]
            have_rel = list(have[0]) + [0] * len(want_rel)
            if (have_rel[: len(want_rel)] == want_rel) != (op == "=="):
                return False
            continue
        want = version_key(want_text)
        if want is None:
            return None
        if op == "==" and "+" in want_text:
            ok = version.strip().lower() == want_text.lower()
        elif op == "==":
            ok = have == want
        elif op == "!=":
            ok = have != want
        elif op == ">=":
            ok = have >= want
        elif op == "<=":
            ok = have <= want
        elif op == ">":
            ok = have > want
        elif op == "<":
            ok = have < want
        else:  # ~=: >= want, and the same release prefix without its last number
            prefix_len = max(1, len(want[0]) - 1)
            padded = list(have[0]) + [0] * max(0, prefix_len - len(have[0]))
            ok = have >= want and padded[:prefix_len] == list(want[0][:prefix_len])
        if not ok:
            return False
    return True


def normalize_dist(name: str) -> str:
    """PEP 503 name normalization (``Foo_Bar`` → ``foo-bar``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


class Requirement(NamedTuple):
    """One ``packages:`` entry as far as checking it goes: name and version specifier."""

    text: str
    name: str  # normalized
    spec: str  # "" when any version will do (or a direct URL)


def parse_requirement(text: str, where: str) -> Requirement:
    """``vllm==0.33.0``, ``torch>=2.9,<2.15``, ``pkg[extra]==1``, ``pkg @ URL``, ``pkg; marker``."""
    body = text.split(";", 1)[0].strip()
    match = REQUIREMENT_RE.match(body)
    if match is None or text.strip().startswith("-"):
        raise bad_request(
            f"{where}: {text!r} is not a requirement like 'vllm==0.33.0' (pip options go in "
            "pip_args)"
        )
    rest = match.group(3).strip()
    if rest.startswith("@"):
        rest = ""
    elif rest and version_satisfies("1", rest) is None:
        raise bad_request(f"{where}: cannot read the version specifier {rest!r} of {text!r}")
    return Requirement(text=text.strip(), name=normalize_dist(match.group(1)), spec=rest)


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


def run_streaming(argv: List[str], out: Emitter, interval: float, fields: JSONDict,
                  env: Optional[Dict[str, str]] = None, cwd: Optional[str] = None,
                  secrets: Optional[List[str]] = None) -> Tuple[int, List[str]]:
    """Run a child with stdout+stderr merged, splitting its output on ``\\n`` and ``\\r`` (tqdm
    and pip redraw bars with ``\\r``), and emit ``progress`` events at most every ``interval``
    seconds with the newest line; also when it is silent, so the workstation knows the link is
    alive during a long wheel build. Returns (exit code, the last lines)."""
    import collections
    import select

    hidden = [s for s in (secrets or []) if s]
    started = time.monotonic()
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, env=env, cwd=cwd)
    except OSError as exc:
        return 127, [f"cannot run {argv[0]}: {exc.strerror or exc}"]
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    lines: Any = collections.deque(maxlen=CHILD_EXCERPT_KEEP)
    pending = b""
    last_emit = started
    last_line = ""
    eof = False
    while not eof:
        ready, _, _ = select.select([fd], [], [], min(interval, 0.5))
        if ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                eof = True
            pending += chunk
            parts = re.split(rb"[\r\n]", pending)
            pending = b"" if eof else parts.pop()
            for part in parts:
                text = clean_line(part, hidden).strip()
                if text:
                    lines.append(text)
                    last_line = text
        now = time.monotonic()
        if now - last_emit >= interval and not eof:
            last_emit = now
            out.emit("progress", elapsed=round(now - started, 1), line=last_line, **fields)
    code = proc.wait()
    return code, list(lines)


def classify_child_failure(lines: List[str]) -> Optional[str]:
    """``no_internet`` or ``disk`` when the output says so, else None."""
    text = "\n".join(lines)
    if any(p in text for p in DISK_PATTERNS):
        return "disk"
    if any(p in text for p in NO_INTERNET_PATTERNS):
        return "no_internet"
    return None


def probe_json(argv: List[str], timeout: float = 60.0) -> Tuple[Optional[JSONDict], str]:
    """Run a small probe that prints one JSON object: (object, "") or (None, why not)."""
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return None, f"{argv[0]} did not answer within {timeout:g} s"
    except OSError as exc:
        return None, f"cannot run {argv[0]}: {exc.strerror or exc}"
    text = proc.stdout.decode("utf-8", errors="replace").strip()
    if proc.returncode == 0 and text:
        try:
            data = json.loads(text.splitlines()[-1])
            if isinstance(data, dict):
                return data, ""
        except ValueError:
            pass
    err = (proc.stderr.decode("utf-8", errors="replace") + text).strip().splitlines()
    return None, f"{argv[0]} failed (exit {proc.returncode}): {err[-1] if err else 'no output'}"


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


def parse_requires(raw: JSONDict) -> JSONDict:
    """``requires: {python, driver, disk_gb}``, validated."""
    req = get_dict(raw, "requires", "")
    out: JSONDict = {"python": get_opt_str(req, "python", "requires."),
                     "driver": get_opt_str(req, "driver", "requires."),
                     "disk_gb": None}
    for key in ("python", "driver"):
        spec = out[key]
        if spec is not None and version_satisfies("1", spec) is None:
            raise bad_request(f"requires.{key}: cannot read {spec!r}; write it like '>=3.10'")
    if req.get("disk_gb") is not None:
        out["disk_gb"] = get_num(req, "disk_gb", "requires.", 0.0, positive=True)
    unknown = sorted(set(req) - {"python", "driver", "disk_gb"})
    if unknown:
        raise bad_request(f"requires: unknown key(s) {', '.join(unknown)}; known: python, "
                          "driver, disk_gb")
    return out


def check_driver(spec: Optional[str], gpus: List[JSONDict], gpu_error: Optional[str]) -> JSONDict:
    """The NVIDIA driver against ``requires.driver`` (``driver`` error when it falls short)."""
    version = next((str(g.get("driver")) for g in gpus if g.get("driver")), None)
    check: JSONDict = {"driver": version, "required": spec, "ok": True}
    if spec is None:
        return check
    if version is None:
        raise AgentError(
            "driver",
            f"the playbook requires NVIDIA driver {spec} but nvidia-smi gave no driver version "
            f"({gpu_error or 'no GPUs listed'}); install the NVIDIA driver (and make nvidia-smi "
            "reachable through the host file's env: PATH) on the box, or use another box",
        )
    if version_satisfies(version, spec) is not True:
        raise AgentError(
            "driver",
            f"NVIDIA driver {version} on the box is older than the playbook requires ({spec}); "
            "use a box with a newer driver (CUDA wheels such as torch+cu130 need it) or relax "
            "requires.driver if you know the stack runs on this one",
        )
    return check


def check_disk(paths: List[str], need_gb: Optional[float]) -> List[JSONDict]:
    """Free space where each environment (and the workdir) will live, one entry per filesystem."""
    seen: Set[int] = set()
    checks: List[JSONDict] = []
    for path in paths:
        base = nearest_existing(path)
        try:
            st = os.stat(base)
            usage = shutil.disk_usage(base)
        except OSError:
            continue
        if st.st_dev in seen:
            continue
        seen.add(st.st_dev)
        free_gb = usage.free / 1e9
        entry = {"path": path, "checked_at": base, "free_gb": round(free_gb, 1),
                 "required_gb": need_gb}
        checks.append(entry)
        if need_gb is not None and free_gb < need_gb:
            raise AgentError(
                "disk",
                f"only {free_gb:.1f} GB free at {base} (for {path}); the playbook requires "
                f"{need_gb:g} GB (requires.disk_gb). Free space (old venvs, HF cache, "
                "checkpoints) or rent a box with a larger disk; nothing was installed",
            )
    return checks


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


def hub_endpoint(override: Optional[str]) -> Tuple[str, int, str]:
    """(host, port, url) of the hub: the request's ``endpoint``, else $HF_ENDPOINT, else
    https://huggingface.co."""
    url = override or os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    parsed = urllib.parse.urlsplit(url if "://" in url else f"https://{url}")
    host = parsed.hostname or "huggingface.co"
    try:
        port = parsed.port or (80 if parsed.scheme == "http" else 443)
    except ValueError:
        raise bad_request(f"endpoint: cannot read a port in {url!r}") from None
    return host, port, url


def hub_reachable(host: str, port: int, timeout: float = HUB_CONNECT_TIMEOUT_S) -> Tuple[bool, str]:
    """Whether a TCP connection to the hub succeeds (DNS + connect) within ``timeout``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True, ""
    except OSError as exc:
        return False, f"{host}:{port}: {exc.strerror or exc}"
