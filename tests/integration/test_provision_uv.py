"""``provision`` with uv: the bootstrap venv, uv on PATH, the fallback to pip, the same
environment either way, errors read from uv's own output, and index tokens kept out of argv.

The packages are tiny wheels built by the test (test_provision.make_wheel). uv itself is a
real uv wheel, downloaded once per test cache from the index this machine's pip reaches; the
tests that need it skip, saying so, only when no uv wheel can be had at all. The pip fallback
tests need nothing from outside.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from outrig import session as session_module
from outrig.console import Reporter
from outrig.errors import RemoteError
from outrig.journal import Journal
from outrig.ops.provision import ProvisionResult, provision
from outrig.session import Project
from tests.support.network import serve
from tests.support.provisioning import CountingCall, envs_playbook, make_wheel

PROJECT = Project(Path(__file__).resolve().parents[2])

pytestmark = pytest.mark.integration
TOKEN = "idx-sekrit-TOKEN-4242"


@pytest.fixture(scope="session")
def uv_wheel(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A uv wheel for this platform, fetched once into pytest's cache (kept between runs; a
    session folder when the cache plugin is off)."""
    cache = getattr(request.config, "cache", None)
    folder = Path(cache.mkdir("uv-wheel")) if cache is not None else \
        tmp_path_factory.mktemp("uv-wheel")
    found = sorted(folder.glob("uv-*.whl"))
    if not found:
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps",
                               "--only-binary", ":all:", "--disable-pip-version-check", "-q",
                               "-d", str(folder), "uv"], capture_output=True, text=True,
                              timeout=300, check=False)
        found = sorted(folder.glob("uv-*.whl"))
        if proc.returncode != 0 or not found:
            pytest.skip("uv cannot be had here (pip download uv failed: "
                        f"{(proc.stderr.strip().splitlines() or ['no output'])[-1]}); the pip "
                        "fallback is tested without it")
    return found[-1]


@pytest.fixture(scope="session")
def uv_binary(uv_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uv executable out of the wheel, in a folder of its own (to put on the box's PATH)."""
    folder = tmp_path_factory.mktemp("uv-bin")
    with zipfile.ZipFile(uv_wheel) as archive:
        [member] = [n for n in archive.namelist() if n.endswith(".data/scripts/uv")]
        (folder / "uv").write_bytes(archive.read(member))
    (folder / "uv").chmod(0o755)
    return folder


@pytest.fixture
def journal(tmp_path: Path) -> Journal:
    return Journal(tmp_path / "state")


def wheel_folder(tmp_path: Path, uv_wheel: Path | None) -> Path:
    """outrigdemo 1.0 and 2.0, and the uv wheel when given."""
    folder = tmp_path / "wheels"
    for version in ("1.0", "2.0"):
        make_wheel(folder, "outrigdemo", version)
    if uv_wheel is not None:
        shutil.copy(uv_wheel, folder / uv_wheel.name)
    return folder


def uv_host(box_host: Path, tmp_path: Path, path_dirs: Sequence[Path] = ()) -> Path:
    """A copy of the sandbox host (same name) with its own uv cache (cold), no pip config
    files (the same on every machine), and ``path_dirs`` first on PATH."""
    config = yaml.safe_load(box_host.read_text())
    env = dict(config.get("env") or {})
    env["UV_CACHE_DIR"] = str(tmp_path / "uv-cache")
    env["PIP_CONFIG_FILE"] = os.devnull
    if path_dirs:
        env["PATH"] = ":".join([*map(str, path_dirs), env.get("PATH", "$PATH")])
    config["env"] = env
    folder = tmp_path / f"hosts-{len(list(tmp_path.glob('hosts-*')))}"
    folder.mkdir()
    path = folder / box_host.name
    path.write_text(yaml.safe_dump(config))
    return path


def env_entry(venv: Path, wheels: Path, pin: str = "1.0", **extra: Any) -> dict[str, Any]:
    return {"demo": {"path": str(venv), "python": sys.executable,
                     "packages": [f"outrigdemo=={pin}"], "no_index": True,
                     "find_links": [str(wheels)], **extra}}


def run(host: Path, tmp_path: Path, journal: Journal, envs: dict[str, Any]) -> ProvisionResult:
    return provision(PROJECT, str(host), Reporter(quiet=True),
                     playbook=str(envs_playbook(tmp_path, envs)), journal=journal)


def installer_events(result: ProvisionResult) -> list[dict[str, Any]]:
    return [e for e in result.events if e.get("event") == "installer"]


def distributions(venv: Path) -> dict[str, str]:
    """Every distribution in a venv with its version, as its interpreter lists them."""
    script = ("import json; from importlib import metadata; print(json.dumps("
              "{d.metadata['Name'].lower(): d.version for d in metadata.distributions()}))")
    out = subprocess.run([str(venv / "bin" / "python"), "-c", script], capture_output=True,
                         text=True, check=True).stdout
    return dict(json.loads(out))


def test_uv_is_bootstrapped_once_then_reused_and_a_rerun_is_a_noop(
        box_host: Path, tmp_path: Path, uv_wheel: Path, journal: Journal,
        monkeypatch: pytest.MonkeyPatch) -> None:
    host = uv_host(box_host, tmp_path)
    wheels = wheel_folder(tmp_path, uv_wheel)
    venv = tmp_path / "venvs" / "demo"
    first = run(host, tmp_path, journal, env_entry(venv, wheels))
    [event] = installer_events(first)
    assert event["installer"] == "uv" and event["source"] == "bootstrapped"
    made = tmp_path / "workdir" / ".outrig" / "uv-bootstrap" / "bin" / "uv"
    assert event["uv"] == str(made) and made.exists()
    [env] = first.environments
    assert env["status"] == "created" and env["installer"] == "uv" and env["fallback"] is None
    assert distributions(venv)["outrigdemo"] == "1.0"
    assert journal.host_facts(host.stem)["environments"]["demo"]["installer"] == "uv"

    second = run(host, tmp_path, journal, env_entry(venv, wheels, pin="2.0"))
    [event] = installer_events(second)
    assert event["source"] == "bootstrap", "the bootstrap venv is reused, not made again"
    assert not [e for e in second.events if e.get("phase") == "uv-bootstrap"]
    assert second.environments[0]["status"] == "updated"
    assert distributions(venv)["outrigdemo"] == "2.0"

    monkeypatch.setattr(session_module, "AgentCall", CountingCall)
    CountingCall.calls = 0
    third = run(host, tmp_path, journal, env_entry(venv, wheels, pin="2.0"))
    assert CountingCall.calls == 1
    assert third.environments[0]["status"] == "ok"
    assert not installer_events(third) and not [e for e in third.events
                                                if e.get("event") == "progress"]


def test_uv_on_path_is_used_without_a_bootstrap(
        box_host: Path, tmp_path: Path, uv_binary: Path, journal: Journal) -> None:
    host = uv_host(box_host, tmp_path, [uv_binary])
    wheels = wheel_folder(tmp_path, None)  # no uv wheel: a bootstrap would fail
    venv = tmp_path / "venvs" / "demo"
    result = run(host, tmp_path, journal, env_entry(venv, wheels))
    [event] = installer_events(result)
    assert event == {**event, "installer": "uv", "source": "path",
                     "uv": str(uv_binary / "uv")}
    assert result.environments[0]["installer"] == "uv"
    assert not (tmp_path / "workdir" / ".outrig" / "uv-bootstrap").exists()
    assert distributions(venv)["outrigdemo"] == "1.0"


def test_pip_fallback_when_uv_cannot_be_had_gives_the_same_environment(
        box_host: Path, tmp_path: Path, journal: Journal) -> None:
    """Needs no uv at all: the bootstrap finds no uv in find_links and pip installs."""
    host = uv_host(box_host, tmp_path)
    wheels = wheel_folder(tmp_path, None)
    by_pip = tmp_path / "venvs" / "by-pip"
    result = run(host, tmp_path, journal, env_entry(by_pip, wheels))
    [event] = installer_events(result)
    assert event["installer"] == "pip"
    assert "uv is not on PATH and cannot be installed" in event["fallback"]
    assert "pip install uv" in event["fallback"]
    [env] = result.environments
    assert env["installer"] == "pip" and env["fallback"] == event["fallback"]
    assert distributions(by_pip)["outrigdemo"] == "1.0"

    forced = tmp_path / "venvs" / "forced-pip"
    result = run(host, tmp_path, journal, env_entry(forced, wheels, installer="pip"))
    [event] = installer_events(result)
    assert event["installer"] == "pip" and event["fallback"] is None
    assert distributions(forced) == distributions(by_pip)


def test_uv_and_pip_make_the_same_environment(
        box_host: Path, tmp_path: Path, uv_binary: Path, journal: Journal) -> None:
    host = uv_host(box_host, tmp_path, [uv_binary])
    wheels = wheel_folder(tmp_path, None)
    venvs = {name: tmp_path / "venvs" / name for name in ("uv", "pip")}
    for name, venv in venvs.items():
        result = run(host, tmp_path, journal, env_entry(venv, wheels, installer=name))
        assert [e["installer"] for e in installer_events(result)] == [name]
    assert distributions(venvs["uv"]) == distributions(venvs["pip"])
    assert distributions(venvs["uv"])["outrigdemo"] == "1.0"


def test_pip_args_uv_does_not_take_fall_back_to_pip(
        box_host: Path, tmp_path: Path, uv_binary: Path, journal: Journal) -> None:
    host = uv_host(box_host, tmp_path, [uv_binary])
    wheels = wheel_folder(tmp_path, None)
    venv = tmp_path / "venvs" / "demo"
    result = run(host, tmp_path, journal,
                 env_entry(venv, wheels, pip_args=["--no-warn-conflicts"]))
    [event] = installer_events(result)
    assert event["installer"] == "pip"
    assert event["fallback"] == ("pip_args has --no-warn-conflicts, which uv pip install does "
                                 "not take")
    assert distributions(venv)["outrigdemo"] == "1.0"


def test_forced_uv_errors_are_read_from_uv_output(
        box_host: Path, tmp_path: Path, uv_binary: Path, journal: Journal) -> None:
    host = uv_host(box_host, tmp_path, [uv_binary])
    wheels = wheel_folder(tmp_path, None)
    venv = tmp_path / "venvs" / "demo"
    missing = env_entry(venv, wheels, installer="uv")
    missing["demo"]["packages"] = ["nosuchpkg==1.0"]
    with pytest.raises(RemoteError) as info:
        run(host, tmp_path, journal, missing)
    assert info.value.kind == "pip"
    assert "uv found no distribution for nosuchpkg==1.0" in str(info.value)

    offline = {"demo": {"path": str(venv), "python": sys.executable, "installer": "uv",
                        "packages": ["outrigdemo==3.0"],
                        "index_url": "http://127.0.0.1:9/simple",
                        "pip_args": ["--retries", "0", "--timeout", "2"]}}
    with pytest.raises(RemoteError) as info:
        run(host, tmp_path, journal, offline)
    assert info.value.kind == "no_internet"
    assert "uv cannot reach the package index (http://127.0.0.1:9/simple)" in str(info.value)

    bare = uv_host(box_host, tmp_path)  # no uv on PATH, no uv wheel: nothing to bootstrap
    with pytest.raises(RemoteError) as info:
        run(bare, tmp_path, journal, env_entry(tmp_path / "venvs" / "x", wheels,
                                               installer="uv"))
    assert info.value.kind == "pip" and "installer: uv is set" in str(info.value)


@pytest.fixture
def token_index(tmp_path: Path) -> Iterator[str]:
    """A PEP 503 index of outrigdemo on 127.0.0.1 (it takes any credentials); its base URL."""
    root = tmp_path / "index"
    page = root / "simple" / "outrigdemo"
    page.mkdir(parents=True)
    links = []
    for version in ("1.0", "2.0"):
        wheel = make_wheel(root / "files", "outrigdemo", version)
        links.append(f'<a href="/files/{wheel.name}">{wheel.name}</a>')
    (page / "index.html").write_text("<html><body>" + "".join(links) + "</body></html>")
    with serve(root) as port:
        yield f"127.0.0.1:{port}"


def argv_logger(folder: Path, real_uv: Path, log: Path) -> Path:
    """A ``uv`` that writes its argv (and nothing of its environment) to ``log``, then runs
    the real one."""
    folder.mkdir(parents=True)
    script = folder / "uv"
    script.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                      f"open({str(log)!r}, 'a').write(json.dumps(sys.argv) + '\\n')\n"
                      f"os.execv({str(real_uv)!r}, [{str(real_uv)!r}] + sys.argv[1:])\n")
    script.chmod(0o755)
    return folder


def test_an_index_token_never_reaches_argv_or_events(
        box_host: Path, tmp_path: Path, uv_binary: Path, journal: Journal,
        token_index: str) -> None:
    log = tmp_path / "uv-argv.log"
    host = uv_host(box_host, tmp_path, [argv_logger(tmp_path / "logbin", uv_binary / "uv", log)])
    venv = tmp_path / "venvs" / "demo"
    envs = {"demo": {"path": str(venv), "python": sys.executable,
                     "packages": ["outrigdemo==2.0"],
                     "index_url": f"http://outrig:{TOKEN}@{token_index}/simple"}}
    result = run(host, tmp_path, journal, envs)
    assert result.environments[0]["installer"] == "uv"
    assert distributions(venv)["outrigdemo"] == "2.0"
    argv = log.read_text()
    assert "uv" in argv and "--python" in argv
    assert TOKEN not in argv
    assert TOKEN not in json.dumps(result.events) + json.dumps(result.environments)
    for path in journal.root.rglob("*"):
        if path.is_file():
            assert TOKEN.encode() not in path.read_bytes(), path

    # A failing install through the same index: its message and excerpt hide the token too.
    envs["demo"]["packages"] = ["outrigdemo==9.0"]
    envs["demo"]["installer"] = "uv"
    with pytest.raises(RemoteError) as info:
        run(host, tmp_path, journal, envs)
    assert info.value.kind == "pip" and "outrigdemo==9.0" in str(info.value)
    assert TOKEN not in str(info.value) + json.dumps(info.value.excerpt)


def test_a_failed_uv_install_falls_back_to_pip(
        box_host: Path, tmp_path: Path, journal: Journal) -> None:
    """A uv whose install fails in a way that is neither the disk nor the network (a stand-in
    that answers --version and fails every install, as a resolver or build difference would)
    leaves the work to pip; ``installer: uv`` would have stopped there."""
    folder = tmp_path / "broken-uv"
    folder.mkdir()
    (folder / "uv").write_text(
        "#!/bin/sh\n"
        "if [ \"$1\" = --version ]; then echo 'uv 0.0.0'; exit 0; fi\n"
        "echo 'error: Failed to build `outrigdemo==1.0`' >&2\n"
        "echo '  cause: stand-in build backend refused' >&2\n"
        "exit 2\n")
    (folder / "uv").chmod(0o755)
    host = uv_host(box_host, tmp_path, [folder])
    wheels = wheel_folder(tmp_path, None)
    venv = tmp_path / "venvs" / "demo"
    result = run(host, tmp_path, journal, env_entry(venv, wheels))
    kinds = [(e["installer"], e.get("fallback")) for e in installer_events(result)]
    assert kinds == [("uv", None), ("pip", "uv pip install failed (exit 2): error: Failed to "
                                           "build `outrigdemo==1.0` (cause: stand-in build "
                                           "backend refused)")]
    assert result.environments[0]["installer"] == "pip"
    assert distributions(venv)["outrigdemo"] == "1.0"
    with pytest.raises(RemoteError) as info:
        run(host, tmp_path, journal, env_entry(tmp_path / "venvs" / "strict", wheels,
                                               installer="uv"))
    assert info.value.kind == "pip" and "uv install into" in str(info.value)
