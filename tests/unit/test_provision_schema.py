"""Pure parts of provision and hub staging: the playbook schema, hub source strings, and the
agent's version and requirement checks (remote/agent/versions.py, remote/agent/provision.py,
imported as modules)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from outrig._box.agent import events as box_events
from outrig._box.agent import provision as box_provision
from outrig._box.agent import versions as box_versions
from outrig.errors import ConfigError
from outrig.formats.hub_source import HubSource, is_hub_source, parse_hub_source
from outrig.playbook import load_job


@pytest.fixture(scope="module")
def agent() -> ModuleType:
    """The agent module under test, imported as any module is (outrig._box.agent.provision)."""
    return box_provision


def load(tmp_path: Path, **body: Any) -> Any:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({"name": "p", "processes": {"a": {"command": "true"}},
                                    **body}))
    return load_job(path)


def test_environments_and_requires_load(tmp_path: Path) -> None:
    job = load(tmp_path, environments={"vllm": {"path": "/workspace/venvs/vllm",
                                                "python": "python3.12",
                                                "packages": ["vllm==0.33.0", "hf_xet>=1.1"],
                                                "extra_index_urls": ["https://x/simple"]}},
               requires={"python": ">=3.11", "driver": ">=580", "disk_gb": 100})
    env = job.spec.environments["vllm"]
    assert env.to_request("vllm")["packages"] == ["vllm==0.33.0", "hf_xet>=1.1"]
    assert job.spec.requires.to_request() == {"python": ">=3.11", "driver": ">=580",
                                              "disk_gb": 100}


@pytest.mark.parametrize(("body", "words"), [
    ({"environments": {"v": {"path": "/v", "packages": ["--pre"]}}}, "pip_args"),
    ({"environments": {"v": {"path": "relative/v"}}}, "absolute"),
    ({"environments": {"v": {"path": "/v", "pakages": []}}}, "pakages"),
    ({"environments": {"v": {"path": "/v", "packages": ["vllm=0.3"]}}}, "specifier"),
    ({"environments": {"9v": {"path": "/v"}}}, "start with a letter"),
    ({"requires": {"driver": "580+"}}, "specifier"),
    ({"requires": {"disk_gb": -1}}, "disk_gb"),
])
def test_bad_environment_specs_name_the_key(tmp_path: Path, body: dict[str, Any],
                                            words: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, **body)
    assert words in str(info.value)


def test_hub_sources() -> None:
    assert parse_hub_source("hf:Qwen/Qwen3-8B") == HubSource("model", "Qwen/Qwen3-8B")
    assert parse_hub_source("hf-dataset:acme/chat@v2.1") == HubSource("dataset", "acme/chat",
                                                                      "v2.1")
    assert str(HubSource("dataset", "a/b", "main")) == "hf-dataset:a/b@main"
    assert parse_hub_source("/data/models/qwen") is None and not is_hub_source("uk-node:/x")
    assert parse_hub_source("hf:gpt2") == HubSource("model", "gpt2")
    for bad, words in [("hf:", "names no repo"), ("hf:a/b/c", "not a hub repo id"),
                       ("hf:a/b@", "no revision"), ("hf-dataset:a b/c", "not a hub repo id"),
                       ("hf:a/b@..", "revision")]:
        with pytest.raises(ConfigError) as info:
            parse_hub_source(bad, where="stage.model")
        assert words in str(info.value) and "stage.model" in str(info.value)


@pytest.mark.parametrize(("version", "spec", "ok"), [
    ("580.159.04", ">=580", True), ("575.57.08", ">=580", False),
    ("3.11.7", ">=3.10", True), ("3.9.18", ">=3.10", False), ("3.12.1", ">=3.11,<3.15", True),
    ("0.33.0", "==0.33.0", True), ("0.33", "==0.33.0", True), ("0.33.1", "==0.33.0", False),
    ("2.13.0+cu130", "==2.13.0", True), ("2.13.0+cu130", "==2.13.0+cu128", False),
    ("2.9.1", "==2.9.*", True), ("2.10.0", "==2.9.*", False), ("1.4.2", "~=1.4", True),
    ("2.0", "~=1.4", False), ("0.10.0rc1", ">=0.10.0", False), ("1.0.post1", ">1.0", True),
])
def test_agent_version_satisfies(version: str, spec: str, ok: bool) -> None:
    assert box_versions.version_satisfies(version, spec) is ok


def test_agent_requirement_parsing() -> None:
    req = box_versions.parse_requirement("Flash_Attn[cuda]==2.8.3 ; sys_platform == 'linux'",
                                         "p")
    assert (req.name, req.spec) == ("flash-attn", "==2.8.3")
    assert box_versions.parse_requirement("pkg @ https://x/pkg.whl", "p").spec == ""
    with pytest.raises(box_events.AgentError):
        box_versions.parse_requirement("--pre", "p")


def test_installer_key_is_checked_where_the_playbook_loads(tmp_path: Path) -> None:
    job = load(tmp_path, environments={"a": {"path": "/v/a"}, "b": {"path": "/v/b",
                                                                  "installer": "pip"}})
    assert job.spec.environments["a"].to_request("a")["installer"] == "auto"
    assert job.spec.environments["b"].to_request("b")["installer"] == "pip"
    with pytest.raises(ConfigError) as info:
        load(tmp_path, environments={"a": {"path": "/v/a", "installer": "conda"}})
    assert str(tmp_path / "p.yaml") in str(info.value)
    assert "environments.a.installer" in str(info.value) and "'uv'" in str(info.value)


def test_index_credentials_travel_as_secrets(tmp_path: Path) -> None:
    from outrig.ops.provision import provision_request

    job = load(tmp_path, environments={"a": {"path": "/v/a",
                                             "index_url": "https://me:t0ken@h.invalid/simple",
                                             "extra_index_urls": ["https://h.invalid/x"]}})
    request = provision_request(job, dry_run=False)
    assert request["secrets"] == {"INDEX_a_0": "t0ken"}
    plain = load(tmp_path, environments={"a": {"path": "/v/a"}})
    assert "secrets" not in provision_request(plain, dry_run=False)


def test_the_agent_refuses_an_unknown_installer(agent: ModuleType) -> None:
    with pytest.raises(agent.AgentError, match="installer"):
        agent.EnvSpec({"name": "a", "path": "/v/a", "installer": "conda"}, 0)
