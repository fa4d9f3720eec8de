"""The dflash layouts across nodes (docs/scale-out.md, "A verifier across nodes") planned
for every node, as deploy plans them: what the unit and the real-parser tests check."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from outrig.inventory import Host
from outrig.plan import HostFacts, NodePlace, Plan, make_plan
from outrig.playbook import deep_merge, load_job

REPO = Path(__file__).resolve().parents[2]
ADDRESSES = ("10.0.0.1", "10.0.0.2", "10.0.0.3")
FACTS = HostFacts(gpu_count=8, gpu_memory_mib=97_871, source="test")


def split_doc(**overrides: Any) -> dict[str, Any]:
    """The example playbook (vLLM on nodes 0-1, the trainer on node 2, Mooncake)."""
    doc = yaml.safe_load((REPO / "playbooks" / "dflash-span.yaml").read_text())
    return deep_merge(doc, overrides)


def colocated_doc(**overrides: Any) -> dict[str, Any]:
    """Two nodes, each with half the server (tensor 8 across them) and two trainer ranks."""
    return split_doc(**deep_merge({"nodes": 2, "dflash": {
        "server": {"gpus": [0, 1, 2, 3], "tensor": 8, "data": 1},
        "trainer": {"nodes": None, "gpus": [4, 5, 6, 7]}}}, overrides))


def node_plans(tmp_path: Path, doc: dict[str, Any], *, addresses: tuple[str, ...] = ADDRESSES,
               declared: bool = False, facts: HostFacts = FACTS) -> list[Plan]:
    path = tmp_path / "span.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    job = load_job(path)
    count = int(doc["nodes"])
    plans = []
    for rank in range(count):
        host = Host(name=f"n{rank}", hostname=addresses[rank], workdir="/workspace/dflash")
        place = NodePlace(rank=rank, nnodes=count, head_host=addresses[0], job_id="job-1",
                          hosts=addresses[:count], head_declared=declared)
        plans.append(make_plan(job, host, facts, f"job-1-node{rank}", place))
    return plans


