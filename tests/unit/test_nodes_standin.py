"""The rendezvous of tests/standins/fake_torchrun.py behaves as its docstring's table says
torch's does: node 0 hosts the store, the others join, the workers get torch's environment,
a peer's failure leaves the other node running, and the store host's end ends the rest."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.network import free_port
from tests.support.processes import wait_gone

WORKER = """\
import json, os, sys, time
keys = ["RANK", "GROUP_RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE",
        "GROUP_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"]
print("worker " + json.dumps({k: os.environ.get(k) for k in keys}), flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
sys.exit(3)
"""


class Node:
    """One fake torchrun node, its log file and its worker's fail switch."""

    def __init__(self, proc: subprocess.Popen[Any], log: Path, fail: Path) -> None:
        self.proc, self.log, self.fail = proc, log, fail

    def text(self) -> str:
        return self.log.read_text()

    def workers(self) -> list[dict[str, str]]:
        return [json.loads(line.split(" ", 1)[1]) for line in self.text().splitlines()
                if line.startswith("worker ")]

    def wait_for(self, needle: str, count: int = 1, timeout: float = 60.0) -> None:
        """Wait (on the process's own output, polled) until ``needle`` shows ``count`` times."""
        self._wait(lambda: self.text().count(needle) >= count, repr(needle), timeout)

    def wait_workers(self, count: int, timeout: float = 60.0) -> None:
        """Wait until ``count`` whole ``worker {env}`` lines are logged (a count of the text
        ``worker `` would also match torch's own "Rendezvous'ing worker group" line)."""
        self._wait(lambda: sum(line.startswith("worker ") and line.endswith("}")
                               for line in self.text().splitlines()) >= count,
                   f"{count} worker lines", timeout)

    def _wait(self, done: Callable[[], bool], what: str, timeout: float) -> None:
        import time

        deadline = time.monotonic() + timeout
        while not done():
            assert self.proc.poll() is None or done(), self.text()
            assert time.monotonic() < deadline, f"no {what} in:\n{self.text()}"
            time.sleep(0.05)


@pytest.fixture
def start(tmp_path: Path, procs: Any, standin: Callable[[str], Path]
          ) -> Callable[..., Node]:
    """``start(rank, port[, rdzv_conf])``: a node of a 2-node job with 2 ranks each."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER)

    def run(rank: int, port: int, conf: str = "") -> Node:
        log = tmp_path / f"node{rank}.log"
        fail = tmp_path / f"fail{rank}"
        handle = log.open("w")
        proc = procs.spawn(
            [sys.executable, str(standin("fake_torchrun")), "--nnodes", "2", "--node-rank",
             str(rank), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
             "--rdzv-id", "job-7", "--rdzv-conf", conf, "--nproc-per-node", "2",
             "--shutdown-timeout", "5", "-m", "work", str(fail)],
            env={"FAKE_TORCHRUN_MODULES": json.dumps({"work": str(script)}),
                 "LOGLEVEL": "INFO" if rank == 0 else "WARNING"},
            stdout=handle, stderr=subprocess.STDOUT)
        return Node(proc, log, fail)

    return run


def joined(start: Callable[[int, int], Node]) -> tuple[Node, Node]:
    """Node 0 (the store's host) started first, then node 1; both with two workers up."""
    port = free_port()
    head = start(0, port)
    head.wait_for("Rendezvous'ing worker group")
    other = start(1, port)
    other.wait_workers(2)
    head.wait_workers(2)
    return head, other


def test_node_0_hosts_the_store_and_both_join_with_torchs_environment(
        start: Callable[[int, int], Node]) -> None:
    head, other = joined(start)
    assert head.text().index("starting workers for entrypoint: python") < head.text().index(
        "Rendezvous complete for workers. Result:")
    assert "  group_rank=0" in head.text() and "  group_world_size=2" in head.text()
    # node 1 logs at torch's default level (WARNING): the agent's INFO lines are not shown
    assert "Rendezvous complete" not in other.text()
    assert "node_rank is only used for static rdzv_backend" in other.text()
    ranks = sorted((w["GROUP_RANK"], w["LOCAL_RANK"], w["RANK"])
                   for w in head.workers() + other.workers())
    assert ranks == [("0", "0", "0"), ("0", "1", "1"), ("1", "0", "2"), ("1", "1", "3")]
    for worker in head.workers() + other.workers():
        assert worker["WORLD_SIZE"] == "4" and worker["GROUP_WORLD_SIZE"] == "2"
        assert worker["LOCAL_WORLD_SIZE"] == "2" and worker["TORCHELASTIC_RUN_ID"] == "job-7"
        assert worker["MASTER_ADDR"] == socket.getfqdn()
    assert len({w["MASTER_PORT"] for w in head.workers() + other.workers()}) == 1


def test_a_peer_failing_leaves_the_head_running(start: Callable[[int, int], Node]) -> None:
    head, other = joined(start)
    other.fail.touch()
    assert other.proc.wait(60) == 1
    assert "failed (exitcode: 3)" in other.text()
    # The head's agent is not told (torch: a departed node never enters the wait list).
    # An absence has no event to wait for: the head must stay up through 30 turns of its
    # monitor loop (0.1 s each), which ask the store every turn.
    with pytest.raises(subprocess.TimeoutExpired):
        head.proc.wait(3.0)
    assert len(head.workers()) == 2 and "failed" not in head.text()
    head.proc.terminate()
    assert head.proc.wait(30) == 128 + 15


def test_the_store_host_ending_ends_the_other_node(start: Callable[[int, int], Node]) -> None:
    head, other = joined(start)
    head.fail.touch()
    assert head.proc.wait(60) == 1
    assert other.proc.wait(60) == 1
    assert "The connection to the C10d store has failed" in other.text()
    assert "closing signal SIGTERM" in other.text()
    assert wait_gone([other.proc.pid]) == []


def test_is_host_decides_who_hosts_the_store(start: Callable[..., Node]) -> None:
    port = free_port()
    other = start(1, port, "is_host=0")  # started first, yet told not to host: it waits
    head = start(0, port, "is_host=1")
    head.wait_workers(2)
    other.wait_workers(2)
    head.fail.touch()
    assert head.proc.wait(60) == 1
    assert other.proc.wait(60) == 1  # the store was the head's: its end ends node 1
    assert "The connection to the C10d store has failed" in other.text()
