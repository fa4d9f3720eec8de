"""What a command through a live keeper imports: no SSH stack. A warm ``outrig status`` (and
``exec``, ``check``) in a fresh interpreter reaches the keeper over its unix socket, so
paramiko and Fabric are never imported; a direct command (``--no-keep``) does import them, so
the check can fail. Neither plans, so neither imports the planner or the recipes. Asserted on
the modules the interpreter holds and on the TCP connections the latency proxy counted (a warm
command opens none), never on time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from outrig.connectors.keeper.client import keepers
from outrig.sandbox.proxy import LatencyProxy

pytestmark = pytest.mark.integration
SSH_STACK = ("paramiko", "fabric")

PROBE = """
import json, sys
from outrig.cli import program
code = 0
try:
    program.run(["outrig", *sys.argv[1:]])
except SystemExit as exc:
    code = exc.code if isinstance(exc.code, int) else 1
print(json.dumps({"code": code, "modules": sorted(sys.modules)}), file=sys.stderr)
"""


@pytest.fixture
def proxied(box_host: Path, make_proxy: Any) -> tuple[Path, LatencyProxy]:
    """The sandbox's host file through a proxy that counts TCP connections."""
    config = yaml.safe_load(box_host.read_text())
    proxy: LatencyProxy = make_proxy(config["port"], one_way_delay=0.0)
    config["port"] = proxy.port
    path = box_host.with_name("proxied.yaml")
    path.write_text(yaml.safe_dump(config))
    return path, proxy


def run_fresh(cwd: Path, *args: str) -> tuple[set[str], str]:
    """``outrig ARGS`` in a fresh interpreter: the modules it held at the end, and stdout."""
    done = subprocess.run([sys.executable, "-c", PROBE, *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)
    report = json.loads(done.stderr.strip().splitlines()[-1])
    assert report["code"] == 0, done.stderr
    return set(report["modules"]), done.stdout


def ssh_stack(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if m.split(".")[0] in SSH_STACK)


@pytest.mark.parametrize("args", [["status", "--json"], ["exec", "--", "true"],
                                  ["check", "--json"]])
def test_a_command_through_a_live_keeper_imports_no_ssh_stack(
        proxied: tuple[Path, LatencyProxy], tmp_path: Path, keeping: None,
        args: list[str]) -> None:
    host, proxy = proxied
    run_fresh(tmp_path, "status", "--host", str(host), "--json")
    assert proxy.accepted == 1 and len(keepers()) == 1, "the first command left a keeper"
    task, *rest = args
    warm, _ = run_fresh(tmp_path, task, "--host", str(host), *rest)
    assert proxy.accepted == 1, "the warm command opened no TCP connection of its own"
    assert ssh_stack(warm) == []
    assert "outrig.connectors.keeper.client" in warm
    assert not warm & {"outrig.plan", "outrig.recipes"}, "nothing was planned"


def test_a_direct_command_does_import_the_ssh_stack(
        proxied: tuple[Path, LatencyProxy], tmp_path: Path, keeping: None) -> None:
    """The probe can fail: with no keeper to go through (``--no-keep``) the command opens
    its own SSH connection, and paramiko and Fabric are imported."""
    host, proxy = proxied
    cold, out = run_fresh(tmp_path, "status", "--host", str(host), "--json", "--no-keep")
    assert json.loads(out.splitlines()[-1])["ok"]
    assert proxy.accepted == 1 and keepers() == []
    assert {"paramiko", "fabric"} <= set(ssh_stack(cold))
