"""``provision`` and ``hub_download`` end to end against the sandbox sshd.

No internet is assumed: packages are tiny wheels built here (a hand-made zip: no build step,
no network) and installed with ``no_index`` + ``find_links``; "no internet" is an index on a
closed loopback port; the hub is tests/standins/fake_hf.py copying from a local folder.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from outrig import session as session_module
from outrig.console import Reporter
from outrig.errors import RemoteError
from outrig.formats.hub_source import parse_hub_source
from outrig.inventory import HostBook
from outrig.journal import Journal
from outrig.ops.hub_download import hub_download, hub_probe
from outrig.ops.provision import provision
from outrig.session import HostSession, Project
from tests.support.provisioning import CountingCall, envs_playbook, make_wheel

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
PROJECT = Project(REPO)
STANDINS = REPO / "tests" / "standins"
TOKEN = "hf_outrigTEST_sekrit_0123456789"


@pytest.fixture
def wheels(tmp_path: Path) -> Path:
    folder = tmp_path / "wheels"
    for version in ("1.0", "2.0"):
        make_wheel(folder, "outrigdemo", version)
    return folder


@pytest.fixture
def journal(tmp_path: Path) -> Journal:
    return Journal(tmp_path / "state")


def demo_env(venv: Path, wheels: Path, pin: str = "1.0", **extra: Any) -> dict[str, Any]:
    return {"demo": {"path": str(venv), "python": sys.executable,
                     "packages": [f"outrigdemo=={pin}"], "no_index": True,
                     "find_links": [str(wheels)], **extra}}


def installed_version(venv: Path) -> str:
    return subprocess.run([str(venv / "bin" / "python"), "-c",
                           "import outrigdemo; print(outrigdemo.__version__)"],
                          capture_output=True, text=True, check=True).stdout.strip()


def test_provision_creates_then_skips_then_updates(
        box_host: Path, tmp_path: Path, wheels: Path, journal: Journal,
        monkeypatch: pytest.MonkeyPatch) -> None:
    venv = tmp_path / "venvs" / "demo"
    requires = {"python": ">=3.8", "driver": ">=580", "disk_gb": 0.001}
    playbook = envs_playbook(tmp_path, demo_env(venv, wheels), requires)
    reporter = Reporter(quiet=True)

    first = provision(PROJECT, str(box_host), reporter, playbook=str(playbook), journal=journal)
    [env] = first.environments
    assert env["status"] == "created" and env["versions"] == {"outrigdemo": "1.0"}
    assert installed_version(venv) == "1.0"
    assert first.checks["driver"]["driver"] == "580.159.04"
    assert [e for e in first.events if e.get("event") == "installer"], "says which installer"
    recorded = journal.host_facts(box_host.stem)["environments"]["demo"]
    assert recorded["status"] == "created" and recorded["versions"] == {"outrigdemo": "1.0"}

    # Already right: one exec, no pip, no progress, fast.
    monkeypatch.setattr(session_module, "AgentCall", CountingCall)
    CountingCall.calls = 0
    second = provision(PROJECT, str(box_host), reporter, playbook=str(playbook),
                       journal=journal)
    assert CountingCall.calls == 1
    assert second.environments[0]["status"] == "ok"
    assert not [e for e in second.events if e.get("event") == "progress"]
    assert not [e for e in second.events if e.get("event") == "installer"
                or "install " in str(e.get("msg", ""))]

    # A dry run with a changed pin says what it would do and changes nothing.
    playbook = envs_playbook(tmp_path, demo_env(venv, wheels, pin="2.0"), requires)
    dry = provision(PROJECT, str(box_host), reporter, playbook=str(playbook), dry_run=True,
                    journal=journal)
    assert dry.environments[0]["status"] == "would_update"
    assert dry.environments[0]["missing"] == {"outrigdemo": "1.0"}
    assert installed_version(venv) == "1.0"

    third = provision(PROJECT, str(box_host), reporter, playbook=str(playbook), journal=journal)
    assert third.environments[0]["status"] == "updated"
    assert third.environments[0]["versions"] == {"outrigdemo": "2.0"}
    assert installed_version(venv) == "2.0"
    assert journal.host_facts(box_host.stem)["environments"]["demo"]["versions"] == {
        "outrigdemo": "2.0"}


def test_pip_errors_name_the_package_and_the_network(
        box_host: Path, tmp_path: Path, wheels: Path, journal: Journal) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    reporter = Reporter(quiet=True)

    missing = demo_env(venv, wheels)
    missing["demo"]["packages"] = ["nosuchpkg==1.0"]
    with pytest.raises(RemoteError) as info:
        provision(PROJECT, str(box_host), reporter,
                  playbook=str(envs_playbook(tmp_path, missing)), journal=journal)
    assert info.value.kind == "pip"
    assert "nosuchpkg==1.0" in str(info.value) and "find_links" in str(info.value)
    assert journal.host_facts(box_host.stem)["environments"]["demo"]["status"] == "failed"

    offline = {"demo": {"path": str(venv), "python": sys.executable,
                        "packages": ["outrigdemo==3.0"],
                        "index_url": "http://127.0.0.1:9/simple",
                        "pip_args": ["--timeout", "2", "--retries", "0"]}}
    with pytest.raises(RemoteError) as info:
        provision(PROJECT, str(box_host), reporter,
                  playbook=str(envs_playbook(tmp_path, offline)), journal=journal)
    assert info.value.kind == "no_internet"
    assert "cannot reach the package index" in str(info.value)


@pytest.mark.parametrize(("requires", "kind", "words"), [
    ({"disk_gb": 1e9}, "disk", "requires.disk_gb"),
    ({"driver": ">=999"}, "driver", "580.159.04"),
    ({"python": ">=3.99"}, "python", "requires.python"),
])
def test_box_checks_fail_before_anything_is_installed(
        box_host: Path, tmp_path: Path, wheels: Path, journal: Journal,
        requires: dict[str, Any], kind: str, words: str) -> None:
    venv = tmp_path / "venvs" / "never"
    playbook = envs_playbook(tmp_path, demo_env(venv, wheels), requires)
    with pytest.raises(RemoteError) as info:
        provision(PROJECT, str(box_host), Reporter(quiet=True), playbook=str(playbook),
                  journal=journal)
    assert info.value.kind == kind
    assert words in str(info.value)
    assert not venv.exists()


# --------------------------------------------------------------------------- hub_download


def fake_hub(tmp_path: Path) -> Path:
    hub = tmp_path / "hub"
    model = hub / "acme" / "tiny"
    (model / "sub").mkdir(parents=True)
    (model / "config.json").write_text('{"num_hidden_layers": 2}')
    (model / "model.safetensors").write_bytes(b"\0" * 4096)
    (model / "sub" / "tokenizer.json").write_text("{}")
    data = hub / "datasets" / "acme" / "chat" / "@v2"
    data.mkdir(parents=True)
    (data / "train.jsonl").write_text('{"q": 1}\n')
    (data / "README.md").write_text("readme")
    return hub


def hf_bin(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "hf"
    script.write_text(f"#!/bin/sh\nexec {sys.executable} {STANDINS / 'fake_hf.py'} \"$@\"\n")
    script.chmod(0o755)
    return folder


def hub_host(box_host: Path, tmp_path: Path, *, path_dirs: list[Path],
             endpoint: str | None = None, name: str = "hubbox") -> Path:
    config = yaml.safe_load(box_host.read_text())
    env = dict(config.get("env") or {})
    env["PATH"] = ":".join([*map(str, path_dirs), env.get("PATH", "$PATH")])
    env["FAKE_HF_HUB"] = str(fake_hub(tmp_path))
    env["FAKE_HF_TOKEN_SHA256"] = hashlib.sha256(TOKEN.encode()).hexdigest()
    env["FAKE_HF_ARGV_LOG"] = str(tmp_path / "hf-argv.log")
    env["FAKE_HF_DELAY"] = "0.3"
    env["HF_ENDPOINT"] = endpoint or f"http://127.0.0.1:{config['port']}"
    config["env"] = env
    path = tmp_path / "hosts" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config))
    return path


def session_for(host: Path, journal: Journal) -> HostSession:
    return HostSession(PROJECT, str(host), Reporter(quiet=True), journal,
                       host=HostBook(PROJECT.hosts_dir)(str(host)))


def test_hub_download_passes_the_token_only_to_the_child(
        box_host: Path, tmp_path: Path, journal: Journal, monkeypatch: pytest.MonkeyPatch,
        isolated_home: Path) -> None:
    host = hub_host(box_host, tmp_path, path_dirs=[hf_bin(tmp_path / "bin")])
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    dest = tmp_path / "workdir" / "models" / "tiny"
    events: list[dict[str, Any]] = []
    session = session_for(host, journal)
    try:
        probe = hub_probe(session)
        assert probe["hub_reachable"] is True and probe["client_kind"] == "hf"
        result = hub_download(session, parse_hub_source("hf:acme/tiny"),  # type: ignore[arg-type]
                              str(dest), handler=events.append, progress_interval=0.2)
    finally:
        session.close()
    assert result["files"] == 3 and result["bytes"] == 4096 + len('{"num_hidden_layers": 2}') + 2
    assert (dest / "sub" / "tokenizer.json").read_text() == "{}"
    assert [e for e in events if e.get("event") == "progress"], "tqdm lines become progress"
    assert all("\r" not in str(e.get("line", "")) for e in events)
    # The token reached the child (the fake checks its sha256) but is nowhere else.
    seen = json.dumps(events) + json.dumps(result) + (tmp_path / "hf-argv.log").read_text()
    assert TOKEN not in seen
    for root in (tmp_path / "workdir", journal.root, isolated_home):
        for path in root.rglob("*"):
            if path.is_file():
                assert TOKEN.encode() not in path.read_bytes(), path


def test_hub_download_errors_and_dataset_revision(
        box_host: Path, tmp_path: Path, journal: Journal,
        monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = hf_bin(tmp_path / "bin")
    host = hub_host(box_host, tmp_path, path_dirs=[bin_dir])
    session = session_for(host, journal)
    dest = str(tmp_path / "workdir" / "data")
    try:
        monkeypatch.delenv("HF_TOKEN", raising=False)
        with pytest.raises(RemoteError) as info:
            hub_download(session, parse_hub_source("hf:acme/tiny"), dest)  # type: ignore[arg-type]
        assert info.value.kind == "auth" and "export HF_TOKEN" in str(info.value)
        with pytest.raises(RemoteError) as info:
            hub_download(session, parse_hub_source("hf:acme/tiny"), dest,  # type: ignore[arg-type]
                         token="wrong")
        assert info.value.kind == "auth" and "refused" in str(info.value)
        assert "wrong" not in json.dumps(info.value.excerpt)
        with pytest.raises(RemoteError) as info:
            hub_download(session, parse_hub_source("hf:acme/nope"), dest,  # type: ignore[arg-type]
                         token=TOKEN)
        assert info.value.kind == "not_found"
        source = parse_hub_source("hf-dataset:acme/chat@v2")
        assert source is not None
        result = hub_download(session, source, dest, token=TOKEN, allow_patterns=["*.jsonl"])
        assert result["files"] == 1 and (Path(dest) / "train.jsonl").exists()
        assert not (Path(dest) / "README.md").exists()
    finally:
        session.close()
    argv = [json.loads(line) for line in (tmp_path / "hf-argv.log").read_text().splitlines()]
    assert argv[-1][:2] == ["download", "acme/chat"]
    assert argv[-1][argv[-1].index("--revision"):][:2] == ["--revision", "v2"]
    assert "dataset" in argv[-1] and "*.jsonl" in argv[-1]


def test_hub_download_routes_client_lookup_and_offline(
        box_host: Path, tmp_path: Path, journal: Journal) -> None:
    # The hf next to the given interpreter (a venv's bin) wins over the one on PATH.
    venv_bin = hf_bin(tmp_path / "venv" / "bin")
    (venv_bin / "python").symlink_to(sys.executable)
    host = hub_host(box_host, tmp_path, path_dirs=[hf_bin(tmp_path / "bin")])
    session = session_for(host, journal)
    try:
        probe = hub_probe(session, python=str(venv_bin / "python"))
        assert probe["client"] == str(venv_bin / "hf")
    finally:
        session.close()

    bare = hub_host(box_host, tmp_path / "bare", path_dirs=[], name="bare")
    session = session_for(bare, journal)
    try:
        with pytest.raises(RemoteError) as info:
            hub_download(session, parse_hub_source("hf:acme/tiny"),  # type: ignore[arg-type]
                         str(tmp_path / "d"), token=TOKEN, python=sys.executable)
        assert info.value.kind == "no_hub_client" and "provision" in str(info.value)
    finally:
        session.close()

    offline = hub_host(box_host, tmp_path / "off", path_dirs=[hf_bin(tmp_path / "bin")],
                       endpoint="http://127.0.0.1:9", name="offline")
    session = session_for(offline, journal)
    try:
        assert hub_probe(session)["hub_reachable"] is False
        with pytest.raises(RemoteError) as info:
            hub_download(session, parse_hub_source("hf:acme/tiny"),  # type: ignore[arg-type]
                         str(tmp_path / "d"), token=TOKEN)
        assert info.value.kind == "no_internet"
    finally:
        session.close()
