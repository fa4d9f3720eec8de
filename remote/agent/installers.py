"""Which installer puts an environment's packages in place: uv where it can, pip otherwise.

uv (https://docs.astral.sh/uv/pip/) resolves and installs the same requirements several times
faster than pip, which is most of a fresh box's set-up time. provision uses it when one can be
had: a ``uv`` on PATH, else a small bootstrap venv under the workdir's ``.outrig`` folder
(``python -m venv`` + ``pip install uv`` from the same index the environment uses; made once,
reused after). Whatever uv cannot do the way pip would (a pip option it does not take, a
failed bootstrap, a failed install that is not the network or the disk) falls back to pip, and
the op says which installer ran and why (docs/provision.md).

uv does not read pip's configuration (pip.conf, ``PIP_INDEX_URL``...; "Configuration files and
environment variables" in https://docs.astral.sh/uv/pip/compatibility/), so what pip would take
from there (index, extra indexes, find-links, no-index, constraints, cert) is read here and
handed to uv, and uv is asked for pip's index behaviour (``--index-strategy
unsafe-best-match``: pip takes the best version across all indexes; uv's default stops at the
first index that has the package, same page). Index URLs reach both installers through the
environment, never argv, because they may carry a token (``https://user:TOKEN@host/simple``).
"""

from __future__ import annotations

import configparser
import os
import re
import shutil
import subprocess
import sys
import urllib.parse
from typing import Dict, List, NamedTuple, Optional, Tuple

INSTALLERS = ("auto", "uv", "pip")
UV_REQUIREMENT = "uv"  # what the bootstrap venv installs (from the environment's index)
BOOTSTRAP_DIR = "uv-bootstrap"  # under <workdir>/.outrig
UV_VERSION_TIMEOUT_S = 20.0

# uv's error lines (NO_COLOR set, so no box drawing), as uv 0.13 prints them, e.g.
#   error: No solution found when resolving dependencies
#     cause: Because nosuchpkg was not found in the package registry and you require
#            nosuchpkg==1.0, we can conclude that your requirements are unsatisfiable.
#     cause: Because there is no version of pkg==9.9 and you require pkg==9.9, ...
# (uv-resolver's PubGrub report: "was not found in the package registry" / "in the provided
# package locations" with --no-index, "there is no version of"), and for the network
#   error: Request failed after 3 retries ... cause: error sending request for url (...)
#     cause: client error (Connect) / cause: tcp connect error / cause: dns error
#     cause: Connection refused (os error 111)
# and for a full disk "No space left on device (os error 28)" (the OS's own text).
UV_NO_INTERNET_PATTERNS = (
    "error sending request for url",
    "tcp connect error",
    "dns error",
    "client error (Connect)",
    "Request failed after",
)
UV_MISSING_RES = (
    re.compile(r"Because (\S+) was not found in the .*? and you require (\S+?),"),
    re.compile(r"Because there is no version of (\S+?) and you require (\S+?),"),
)

# pip install options and what uv pip install takes for each ("" drops the option; None keeps
# it as it is). Options with a value are listed in TAKES_VALUE. Anything else makes auto use
# pip: uv would reject it, or read it otherwise.
UV_FLAGS: Dict[str, Optional[str]] = {
    "--no-deps": None, "-U": None, "--upgrade": None, "--no-build-isolation": None,
    "--force-reinstall": "--reinstall", "--pre": "--prerelease=allow",
    "--compile": "--compile-bytecode", "--no-cache-dir": "--no-cache",
    "-c": "-c", "--constraint": "-c", "-r": "-r", "--requirement": "-r",
    "--only-binary": None, "--no-binary": None, "-f": "-f", "--find-links": "-f",
    "--extra-index-url": "", "--index-url": "", "--no-index": None,
    "--trusted-host": "--allow-insecure-host",
    "-q": "", "--quiet": "", "-v": "", "--verbose": "", "--no-input": "",
    "--disable-pip-version-check": "", "--progress-bar": "", "--timeout": "", "--retries": "",
}
TAKES_VALUE = {"-c", "--constraint", "-r", "--requirement", "--only-binary", "--no-binary",
               "-f", "--find-links", "--extra-index-url", "--index-url", "--trusted-host",
               "--progress-bar", "--timeout", "--retries"}
UV_ENV_FOR = {"--timeout": "UV_HTTP_TIMEOUT", "--retries": "UV_HTTP_RETRIES"}


class Unsupported(Exception):
    """What keeps uv from installing this environment the way pip would (auto then uses pip)."""


class PipSettings(NamedTuple):
    """What pip would take from its config files and ``PIP_*`` variables (the index options
    uv needs to be given explicitly)."""

    index_url: Optional[str]
    extra_index_urls: List[str]
    find_links: List[str]
    no_index: bool
    constraints: List[str]
    cert: Optional[str]


def truthy(value: str) -> bool:
    """pip's reading of a boolean setting (``no-index = true``, ``PIP_NO_INDEX=1``)."""
    return value.strip().lower() in ("1", "true", "yes", "on")


def pip_config_files(environ: Dict[str, str], site_prefix: str) -> List[str]:
    """pip's configuration files in the order it loads them (later wins): global (XDG config
    dirs, /etc), user (~/.pip, XDG config home), site (the venv's own), then $PIP_CONFIG_FILE.
    None at all when ``PIP_CONFIG_FILE`` is os.devnull (pip's documented off switch)."""
    explicit = environ.get("PIP_CONFIG_FILE")
    if explicit == os.devnull:
        return []
    home = environ.get("HOME") or os.path.expanduser("~")
    xdg_dirs = (environ.get("XDG_CONFIG_DIRS") or "/etc/xdg").split(":")
    files = [os.path.join(d, "pip", "pip.conf") for d in reversed(xdg_dirs) if d]
    files.append("/etc/pip.conf")
    files.append(os.path.join(home, ".pip", "pip.conf"))
    files.append(os.path.join(environ.get("XDG_CONFIG_HOME") or os.path.join(home, ".config"),
                              "pip", "pip.conf"))
    files.append(os.path.join(site_prefix, "pip.conf"))
    if explicit:
        files.append(explicit)
    return files


def pip_settings(environ: Dict[str, str], site_prefix: str) -> PipSettings:
    """The index options pip would use on this box for the venv at ``site_prefix``: its config
    files (sections global, then install), overridden by ``PIP_*`` variables."""
    found: Dict[str, str] = {}
    for path in pip_config_files(environ, site_prefix):
        parser = configparser.RawConfigParser()
        try:
            parser.read(path)
        except (configparser.Error, OSError, UnicodeDecodeError):
            continue
        for section in ("global", "install"):
            if parser.has_section(section):
                for key, value in parser.items(section):
                    found[key.replace("_", "-")] = value
    for key in ("index-url", "extra-index-url", "find-links", "no-index", "constraint", "cert"):
        variable = environ.get("PIP_" + key.upper().replace("-", "_"))
        if variable is not None and variable.strip():
            found[key] = variable
    return PipSettings(
        index_url=(found.get("index-url") or "").strip() or None,
        extra_index_urls=(found.get("extra-index-url") or "").split(),
        find_links=(found.get("find-links") or "").split(),
        no_index=truthy(found.get("no-index") or ""),
        constraints=(found.get("constraint") or "").split(),
        cert=(found.get("cert") or "").strip() or None,
    )


def url_secrets(urls: List[Optional[str]]) -> List[str]:
    """The credentials inside index URLs (``https://user:TOKEN@host``): redacted from every
    line of installer output that leaves the box."""
    hidden: List[str] = []
    for url in urls:
        if not url:
            continue
        parsed = urllib.parse.urlsplit(url)
        for part in (parsed.password, parsed.username if parsed.password is None else None):
            if part and len(part) >= 4:
                hidden.append(part)
                unquoted = urllib.parse.unquote(part)
                if unquoted != part:
                    hidden.append(unquoted)
    return hidden


def public_url(url: str) -> str:
    """An index URL fit for a message: credentials replaced by ``***``."""
    parsed = urllib.parse.urlsplit(url)
    if "@" not in parsed.netloc:
        return url
    host = parsed.netloc.rsplit("@", 1)[1]
    return urllib.parse.urlunsplit(parsed._replace(netloc="***@" + host))


def translate_pip_args(pip_args: List[str]) -> Tuple[List[str], Dict[str, str]]:
    """``pip_args`` as uv pip install arguments plus uv environment variables; raises
    :class:`Unsupported` naming the first option uv would not take the way pip does."""
    argv: List[str] = []
    env: Dict[str, str] = {}
    items = list(pip_args)
    i = 0
    while i < len(items):
        raw = items[i]
        i += 1
        flag, eq, inline = raw.partition("=") if raw.startswith("--") else (raw, "", "")
        if flag not in UV_FLAGS:
            raise Unsupported(f"pip_args has {flag}, which uv pip install does not take")
        value: Optional[str] = None
        if flag in TAKES_VALUE:
            if eq:
                value = inline
            elif i < len(items):
                value = items[i]
                i += 1
            else:
                raise Unsupported(f"pip_args ends with {flag} and no value")
        elif eq:
            raise Unsupported(f"pip_args has {raw}, but {flag} takes no value")
        if flag in ("--index-url", "--extra-index-url"):
            raise Unsupported(f"pip_args has {flag}; use the environment's index_url / "
                              "extra_index_urls keys, which both installers take")
        if flag in UV_ENV_FOR:
            env[UV_ENV_FOR[flag]] = str(value)
            continue
        target = UV_FLAGS[flag]
        if target == "":
            continue
        argv.append(target or flag)
        if value is not None:
            argv.append(value)
    return argv, env


def uv_install_argv(uv: str, env_python: str, packages: List[str], *, index_url: Optional[str],
                    extra_index_urls: List[str], find_links: List[str], no_index: bool,
                    pip_args: List[str], environ: Dict[str, str],
                    site_prefix: str) -> Tuple[List[str], Dict[str, str]]:
    """``uv pip install --python ENV ...`` with the options pip would use (the playbook's, then
    pip's own settings on the box), and the variables that carry the index URLs. Raises
    :class:`Unsupported` when uv cannot honour them."""
    extra_argv, env = translate_pip_args(pip_args)
    pip = pip_settings(environ, site_prefix)
    argv = [uv, "pip", "install", "--python", env_python, "--color", "never"]
    index = index_url or pip.index_url
    if index:
        env["UV_INDEX_URL"] = index
    extras = [*pip.extra_index_urls, *extra_index_urls]
    if extras:
        env["UV_EXTRA_INDEX_URL"] = " ".join(extras)
    if extras and "UV_INDEX_STRATEGY" not in environ:
        argv += ["--index-strategy", "unsafe-best-match"]
    for link in [*pip.find_links, *find_links]:
        argv += ["--find-links", link]
    if no_index or pip.no_index:
        argv.append("--no-index")
    for constraint in pip.constraints:
        argv += ["-c", constraint]
    if pip.cert and "SSL_CERT_FILE" not in environ:
        env["SSL_CERT_FILE"] = pip.cert
    env["NO_COLOR"] = "1"
    return argv + extra_argv + packages, env


def uv_runs(path: str) -> bool:
    """Whether ``path`` is a uv that answers ``--version``."""
    try:
        proc = subprocess.run([path, "--version"], stdin=subprocess.DEVNULL,
                              capture_output=True, timeout=UV_VERSION_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0 and proc.stdout.startswith(b"uv ")


def bootstrap_paths(state_dir: str) -> Tuple[str, str, str]:
    """(venv dir, its python, its uv) of the bootstrap venv under ``<workdir>/.outrig``."""
    venv = os.path.join(state_dir, BOOTSTRAP_DIR)
    return venv, os.path.join(venv, "bin", "python"), os.path.join(venv, "bin", "uv")


def find_uv(state_dir: str, environ: Dict[str, str]) -> Tuple[Optional[str], str]:
    """A uv that runs, without installing anything: (path, "path"|"bootstrap") or (None, "")."""
    on_path = shutil.which("uv", path=environ.get("PATH"))
    if on_path and uv_runs(on_path):
        return on_path, "path"
    uv = bootstrap_paths(state_dir)[2]
    if os.path.exists(uv) and uv_runs(uv):
        return uv, "bootstrap"
    return None, ""


def bootstrap_commands(state_dir: str, *, index_url: Optional[str],
                       extra_index_urls: List[str], find_links: List[str],
                       no_index: bool) -> Tuple[Optional[List[str]], List[str], Dict[str, str]]:
    """The commands that make the bootstrap venv: (``python -m venv`` or None when the venv is
    there, ``pip install uv`` from the environment's index, the variables with the index
    URLs). The agent's own interpreter makes the venv: it runs on every box outrig reaches."""
    venv, python, _ = bootstrap_paths(state_dir)
    make = None if os.path.exists(python) else [sys.executable, "-m", "venv", venv]
    install = [python, "-m", "pip", "install", "--disable-pip-version-check", "--no-input"]
    env: Dict[str, str] = {}
    if index_url:
        env["PIP_INDEX_URL"] = index_url
    if extra_index_urls:
        env["PIP_EXTRA_INDEX_URL"] = " ".join(extra_index_urls)
    for link in find_links:
        install += ["--find-links", link]
    if no_index:
        install.append("--no-index")
    return make, [*install, UV_REQUIREMENT], env


def uv_missing(lines: List[str]) -> List[str]:
    """The requirements uv's resolver says no index has (``pkg==9.9``)."""
    missing: List[str] = []
    for line in lines:
        for pattern in UV_MISSING_RES:
            match = pattern.search(line)
            if match and match.group(2) not in missing:
                missing.append(match.group(2))
    return missing


def uv_error_line(lines: List[str]) -> str:
    """uv's own summary of a failure: the ``error:`` line and its last ``cause:``."""
    errors = [line for line in lines if line.startswith("error:")]
    causes = [line for line in lines if line.startswith("cause:")]
    text = errors[-1] if errors else (lines[-1] if lines else "no output")
    if causes:
        text += " (" + causes[-1] + ")"
    return text
