"""The dflash playbooks rendered into plans for an 8-GPU box: what the contract tests check
against the real tools' parsers and routes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from outrig.inventory import Host
from outrig.plan import HostFacts, Plan, make_plan
from outrig.playbook import load_job

REPO = Path(__file__).resolve().parents[2]


PLAYBOOKS = ["dflash-qwen36", "dflash-qwen36-8x96"]


HOST = Host(name="box", hostname="127.0.0.1", workdir="/workspace/dflash")


SKIP = ("{} is not importable here (a multi-GB install CI skips); run tests/contract from a "
        "venv with vllm==0.33.* and speculators==0.9.* installed, see docs/dflash.md")


def rendered(playbook: str, *, test: bool = False) -> Plan:
    job = load_job(REPO / "playbooks" / f"{playbook}.yaml", test=test)
    plan = make_plan(job, HOST, HostFacts(gpu_count=8, gpu_memory_mib=97_871), "run-1")
    assert plan.ok, plan.problems
    return plan


def cases() -> list[Any]:
    return [pytest.param(p, t, id=f"{p}{'-test' if t else ''}")
            for p in PLAYBOOKS for t in (False, True)]
