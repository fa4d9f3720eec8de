"""What a command acts on, resolved before anything is sent: one host, a sweep of hosts, or a
multi-node job (outrig/cli/targets.py), and each target calling only its own kind's work."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
import yaml

from outrig import playbook as playbooks
from outrig.cli.settings import Settings
from outrig.cli.targets import (
    NodeJob,
    OneHost,
    Sweep,
    Target,
    one_host,
    select,
    select_deploy,
    select_one,
)
from outrig.console import Reporter
from outrig.errors import ConfigError
from outrig.journal import Journal
from outrig.session import Project


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Three host files, a one-node playbook and a two-node one; nothing is configured."""
    for var in ("OUTRIG_HOST", "OUTRIG_PLAYBOOK", "OUTRIG_PROJECT"):
        monkeypatch.delenv(var, raising=False)
    for name in ("a", "b", "c"):
        path = tmp_path / "hosts" / f"{name}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump({"hostname": f"10.0.0.{ord(name)}",
                                        "workdir": f"/w/{name}"}))
    books = tmp_path / "playbooks"
    books.mkdir()
    (books / "one.yaml").write_text(yaml.safe_dump({
        "name": "one", "params": {"n": 1},
        "processes": {"p": {"command": "echo ${n}", "gpus": []}}}))
    (books / "pair.yaml").write_text(yaml.safe_dump({
        "name": "pair", "nodes": 2, "params": {"n": 1},
        "processes": {"p": {"command": "echo ${node_rank}", "gpus": []}}}))
    return Settings(Project(tmp_path), "test")


def quiet() -> Reporter:
    return Reporter(quiet=True, out=io.StringIO(), err=io.StringIO())


def kinds(target: Target) -> list[str]:
    """Which of the three handlers the target called."""
    called: list[str] = []
    target.run(host=lambda one: called.append("host"),
               sweep=lambda sweep: called.append("sweep"),
               job=lambda job: called.append("job"))
    return called


def test_one_host_is_a_group_of_one_and_calls_only_the_host_work(settings: Settings) -> None:
    target = select(settings, quiet(), ["a"])
    assert isinstance(target, OneHost)
    assert (target.hosts, target.spec, kinds(target)) == (["a"], "a", ["host"])


def test_several_hosts_are_a_sweep_in_the_order_given(settings: Settings) -> None:
    target = select(settings, quiet(), ["c,a", "b"], max_parallel="2", deadline="5")
    assert isinstance(target, Sweep)
    assert (target.hosts, kinds(target)) == (["c", "a", "b"], ["sweep"])
    assert target.limits() == (2, 5.0)


def test_a_run_id_of_a_multi_node_job_is_the_job_whatever_host_says(
        settings: Settings) -> None:
    Journal().record_job("pair-1", {"job_id": "pair-1", "playbook": "pair", "nodes": [
        {"rank": 0, "host": "a", "run_id": "pair-1-node0"},
        {"rank": 1, "host": "b", "run_id": "pair-1-node1"}]})
    Journal().record_run("pair-1-node1", {"run_id": "pair-1-node1", "job_id": "pair-1"})
    for run in ("pair-1", "pair-1-node1"):
        target = select(settings, quiet(), ["c"], run=run)
        assert isinstance(target, NodeJob)
        assert (target.recorded_id, target.hosts, kinds(target)) == ("pair-1", [], ["job"])
    ordinary = select(settings, quiet(), ["c"], run="one-20260101-000000-ab12")
    assert kinds(ordinary) == ["host"]


def test_a_one_host_command_refuses_a_selection_before_anything_is_sent(
        settings: Settings) -> None:
    assert one_host(settings, quiet(), "b").spec == "b"
    with pytest.raises(ConfigError, match="names several hosts"):
        one_host(settings, quiet(), "a,b")
    assert isinstance(select_one(settings, quiet(), "b", None), OneHost)


def test_deploy_loads_the_playbook_once_whatever_the_target(
        settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    loads: list[str] = []
    real = playbooks.load_job  # targets imports it when it loads one (start-up)

    def counting(path: Path, **kwargs: Any) -> Any:
        loads.append(path.stem)
        return real(path, **kwargs)

    monkeypatch.setattr(playbooks, "load_job", counting)
    resolve = {"what": "deploy", "test": False, "params": {"n": 2},
               "sweep_needs_playbook": True}
    one = select_deploy(settings, quiet(), ["a"], "one", **resolve)
    sweep = select_deploy(settings, quiet(), ["a,b"], "one", **resolve)
    job = select_deploy(settings, quiet(), ["a,b"], "pair", **resolve)
    assert loads == ["one", "one", "pair"]
    assert [kinds(t) for t in (one, sweep, job)] == [["host"], ["sweep"], ["job"]]
    assert one.playbook.spec.params["n"] == 2 and sweep.playbook.name == "one"
    assert (job.playbook.name, job.hosts) == ("pair", ["a", "b"])


def test_a_multi_node_playbook_is_a_job_even_on_one_host(settings: Settings) -> None:
    """nodes: 2 decides before --host does; the node count is checked by the nodes op."""
    target = select_deploy(settings, quiet(), ["a"], "pair", what="plan", test=False,
                           params={}, sweep_needs_playbook=False)
    assert isinstance(target, NodeJob) and target.hosts == ["a"]


def test_a_sweep_deploy_without_a_playbook_asks_for_one_and_a_plan_does_not(
        settings: Settings) -> None:
    with pytest.raises(ConfigError, match="which playbook to deploy"):
        select_deploy(settings, quiet(), ["a,b"], None, what="deploy", test=False,
                      params={}, sweep_needs_playbook=True)
    target = select_deploy(settings, quiet(), ["a,b"], None, what="plan", test=False,
                           params={}, sweep_needs_playbook=False)
    assert isinstance(target, Sweep) and target.job is None


@pytest.mark.parametrize(("max_parallel", "deadline", "message"), [
    ("x", None, "--max-parallel must be a whole number"),
    ("0", None, "--max-parallel must be at least 1"),
    ("2", "-1", "--deadline must be a positive number"),
    ("0", "-1", "--deadline must be a positive number"),  # the deadline is checked first
])
def test_sweep_limits_are_read_only_when_the_sweep_runs(
        settings: Settings, max_parallel: str, deadline: str | None, message: str) -> None:
    target = select(settings, quiet(), ["a,b"], max_parallel=max_parallel, deadline=deadline)
    with pytest.raises(ConfigError, match=message):
        target.limits()
    # a single host ignores them, as before
    assert kinds(select(settings, quiet(), ["a"], max_parallel=max_parallel,
                        deadline=deadline)) == ["host"]


def test_a_selection_is_resolved_once_each_host(settings: Settings,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Expanding ``--host`` checks each host through the target's book, so the target (and
    the sessions it opens) reuse that resolution instead of reading the host file again."""
    from outrig import hostgroups, inventory

    (settings.project.hosts_dir / "groups.yaml").write_text(
        yaml.safe_dump({"groups": {"solo": ["a"], "both": ["a", "b"]}}))
    resolved: list[str] = []
    real = inventory.resolve_host

    def counting(spec: str, **kw: Any) -> Any:
        resolved.append(spec)
        return real(spec, **kw)

    monkeypatch.setattr(inventory, "resolve_host", counting)
    monkeypatch.setattr(hostgroups, "resolve_host", counting, raising=False)
    one = select(settings, quiet(), ["solo"])
    assert isinstance(one, OneHost) and one.host.hostname == f"10.0.0.{ord('a')}"
    assert one.resolve("a") is one.host
    assert resolved == ["a"]
    resolved.clear()
    sweep = select(settings, quiet(), ["both"])
    assert isinstance(sweep, Sweep)
    assert [sweep.resolve(h).name for h in sweep.hosts] == ["a", "b"]
    assert resolved == ["a", "b"]
