"""A sandbox "GPU box": a real OpenSSH ``sshd`` on 127.0.0.1 with throwaway keys and fake GPUs.

Why a real sshd: outrig's transport, host-key handling, keepalives, channel and exec costs are
what break against real boxes; an in-process fake SSH server would test a different program.
So this starts the system's ``sshd`` with its own config, host key and client key under
``root`` (nothing of the machine's own SSH setup is read or changed, except that the
privilege-separation dir ``/run/sshd`` must exist) and a fake ``nvidia-smi`` on the PATH that
outrig's host file adds, whose GPUs are held by stand-in processes (see
:mod:`outrig.sandbox.nvidia_smi`).

Only the sshd listener this module started is ever signalled, by its recorded pid (and the
per-connection sshd processes it forked, found by their parent pid).
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from outrig.agent_code import read_stat
from outrig.errors import OutrigError
from outrig.sandbox import dmesg, nvidia_smi

_SSHD_CANDIDATES = ("/usr/sbin/sshd", "/usr/local/sbin/sshd")
_START_TIMEOUT = 10.0


class SandboxError(OutrigError, RuntimeError):
    """The sandbox box could not be set up or started; the message says why and the fix."""


def find_sshd() -> str:
    """Absolute path of the OpenSSH server (sshd refuses to run from a relative path)."""
    found = shutil.which("sshd")
    candidates = ([found] if found else []) + list(_SSHD_CANDIDATES)
    for cand in candidates:
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return os.path.abspath(cand)
    raise SandboxError(
        "the sandbox box needs the OpenSSH server (sshd) but it was not found on PATH, "
        f"{', '.join(_SSHD_CANDIDATES)}; install it with: apt-get install -y openssh-server"
    )


def _find_tool(name: str, fix: str) -> str:
    path = shutil.which(name) or next(
        (p for p in (f"/usr/bin/{name}", f"/usr/local/bin/{name}") if os.access(p, os.X_OK)), None)
    if not path:
        raise SandboxError(f"the sandbox box needs {name} but it was not found; {fix}")
    return path


def free_port() -> int:
    """A port that was free a moment ago (bind 0, read it, release it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _banner_ok(host: str, port: int) -> bool:
    """True when something on host:port accepts and speaks SSH (sends ``SSH-2.0``)."""
    try:
        with socket.create_connection((host, port), timeout=1.0) as s:
            s.settimeout(1.0)
            data = b""
            while b"\n" not in data and len(data) < 256:
                chunk = s.recv(256)
                if not chunk:
                    break
                data += chunk
            return data.startswith(b"SSH-2.0")
    except OSError:
        return False


def _tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(log is empty)"


def children_of(pid: int) -> list[int]:
    """Pids whose parent is ``pid`` (sshd's per-connection processes; tests use it too)."""
    out: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        stat = read_stat(int(entry))
        if stat is not None and stat.ppid == pid:
            out.append(int(entry))
    return out


@dataclass
class SandboxBox:
    """A running (or stopped) sandbox box. Build it with :func:`start_sandbox`."""

    name: str
    root: Path
    host: str
    port: int
    user: str
    identity_file: Path
    known_hosts: Path
    workdir: Path
    bin_dir: Path
    gpu_dir: Path
    gpus: int
    gpu_memory_mib: int
    sshd_config: Path = field(default=Path())
    log_file: Path = field(default=Path())
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    # ------------------------------------------------------------------ host file
    def host_config(self, *, port: int | None = None,
                    workdir: Path | None = None,
                    gpu_dir: Path | None = None,
                    known_hosts: Path | None = None) -> dict[str, object]:
        """The box as a hosts/NAME.yaml mapping.

        ``port`` points it through a :class:`~outrig.sandbox.proxy.LatencyProxy`; ``workdir``,
        ``gpu_dir`` and ``known_hosts`` give a test its own space on the shared box. ``python``
        is this interpreter: the "box" is this machine, and it is what runs the stand-ins.
        """
        return {
            "hostname": self.host,
            "port": int(port if port is not None else self.port),
            "user": self.user,
            "identity_file": str(self.identity_file),
            "known_hosts": str(known_hosts if known_hosts is not None else self.known_hosts),
            "workdir": str(workdir if workdir is not None else self.workdir),
            "env": {
                "PATH": f"{self.bin_dir}:$PATH",
                nvidia_smi.STATE_ENV: str(gpu_dir if gpu_dir is not None else self.gpu_dir),
                # this sshd reads keys from its own file, not ~/.ssh/authorized_keys
                "OUTRIG_AUTHORIZED_KEYS": str(self.root / "keys" / "authorized_keys"),
            },
            "python": sys.executable,
            "gpus": "auto",
        }

    def write_host_file(self, path: Path, **kw: Any) -> Path:
        """Write :meth:`host_config` (``kw`` passed through) as YAML to ``path``."""
        import yaml

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        text = f"# sandbox box {self.name!r} (generated by outrig.sandbox)\n"
        text += yaml.safe_dump(self.host_config(**kw), sort_keys=False)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
        return path

    # ------------------------------------------------------------------ sshd lifecycle
    @property
    def pid(self) -> int | None:
        """Pid of the sshd listener we started, while it runs."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def is_running(self) -> bool:
        """True when our sshd process is alive and answers with an SSH banner."""
        return self.pid is not None and _banner_ok(self.host, self.port)

    def start(self) -> None:
        """(Re)start sshd on the same port; a no-op when it already runs."""
        if self.pid is not None:
            return
        self._proc = _launch_sshd(self.sshd_config, self.log_file)
        _wait_ready(self._proc, self.host, self.port, self.log_file)

    def stop(self, *, drop_sessions: bool = True) -> None:
        """Stop our sshd: SIGTERM, then SIGKILL after 5 s. Idempotent.

        With ``drop_sessions`` (default) the per-connection sshd processes it forked are
        terminated too, so live SSH connections die as they would if the box went away.
        """
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            sessions = children_of(proc.pid) if drop_sessions else []
            proc.send_signal(signal.SIGTERM)
            for pid in sessions:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
            try:
                proc.wait(5.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5.0)
            deadline = time.monotonic() + 3.0
            for pid in sessions:
                while time.monotonic() < deadline and nvidia_smi.pid_alive(pid):
                    time.sleep(0.05)
                if nvidia_smi.pid_alive(pid):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
        else:
            proc.wait()
        self._proc = None

    def __enter__(self) -> SandboxBox:
        return self

    def __exit__(self, exc_type: type[BaseException] | None,
                 exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


def _launch_sshd(config: Path, log_file: Path) -> subprocess.Popen[bytes]:
    # Privilege separation needs this dir when sshd runs as root; it is normally made by the
    # distribution's service unit, which never ran in a container.
    Path("/run/sshd").mkdir(mode=0o755, parents=True, exist_ok=True)
    with open(log_file, "ab") as log:
        return subprocess.Popen(
            [find_sshd(), "-D", "-e", "-f", str(config)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
        )


def _wait_ready(proc: subprocess.Popen[bytes], host: str, port: int, log_file: Path) -> None:
    deadline = time.monotonic() + _START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SandboxError(
                f"sandbox sshd exited with code {proc.returncode} before listening on "
                f"{host}:{port}; its log ({log_file}) ends with:\n{_tail(log_file)}"
            )
        if _banner_ok(host, port):
            return
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    raise SandboxError(
        f"sandbox sshd did not answer on {host}:{port} within {_START_TIMEOUT:.0f} s; "
        f"its log ({log_file}) ends with:\n{_tail(log_file)}"
    )


def _keygen(path: Path, comment: str) -> None:
    keygen = _find_tool("ssh-keygen", "install it with: apt-get install -y openssh-client")
    if path.exists():
        return
    res = subprocess.run(
        [keygen, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False,
    )
    if res.returncode != 0:
        raise SandboxError(f"ssh-keygen failed for {path}: {res.stderr.strip() or res.stdout}")


def _sshd_config(root: Path, port: int, host_key: Path, authorized: Path, user: str, *,
                 log_level: str = "ERROR", max_sessions: int = 50) -> str:
    return "\n".join([
        "# sandbox sshd (outrig.sandbox); nothing here is read from /etc/ssh",
        "ListenAddress 127.0.0.1",
        f"Port {port}",
        f"HostKey {host_key}",
        f"AuthorizedKeysFile {authorized}",
        f"PidFile {root / 'sshd.pid'}",
        "StrictModes no",
        "UsePAM no",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PermitRootLogin prohibit-password",
        f"AllowUsers {user}",
        "MaxStartups 100:30:200",
        f"MaxSessions {max_sessions}",
        f"LogLevel {log_level}",
        "Subsystem sftp internal-sftp",
        "AcceptEnv none",
        "PrintMotd no",
        "UseDNS no",
        "",
    ])


def start_sandbox(root: Path, *, name: str = "sandbox", gpus: int = 8,
                  gpu_memory_mib: int = 49152, gpu_name: str = "NVIDIA L40S",
                  log_level: str = "ERROR", max_sessions: int = 50) -> SandboxBox:
    """Create the box under ``root`` and start its sshd; returns it running.

    ``log_level`` is sshd's (``DEBUG1`` logs every channel open and exec, which tests count);
    ``max_sessions`` its channels per connection (a box that limits them).

    Layout: ``keys/`` (host and client ed25519 keys, authorized_keys), ``workdir/``, ``bin/``
    (the fake ``nvidia-smi``), ``gpu/`` (inventory and holders), ``sshd_config``, ``sshd.log``.
    ``known_hosts`` starts absent: outrig records the host key there on first contact.
    """
    sshd = find_sshd()  # fail first, with the install hint, before writing anything
    del sshd
    root = Path(root).resolve()
    keys, workdir, bin_dir, gpu_dir = (root / d for d in ("keys", "workdir", "bin", "gpu"))
    for d in (keys, workdir, bin_dir, gpu_dir):
        d.mkdir(parents=True, exist_ok=True)
    user = getpass.getuser()

    host_key, client_key = keys / "ssh_host_ed25519_key", keys / "id_ed25519"
    _keygen(host_key, f"outrig-sandbox-host-{name}")
    _keygen(client_key, f"outrig-sandbox-client-{name}")
    authorized = keys / "authorized_keys"
    authorized.write_text((keys / "id_ed25519.pub").read_text())
    os.chmod(authorized, 0o600)

    # The fake nvidia-smi: this module's source with a shebang for this interpreter.
    src = Path(nvidia_smi.__file__).read_text()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!{sys.executable}\n{src}")
    os.chmod(smi, 0o755)
    # The fake kernel log beside it (the agent reads Xid lines with dmesg).
    log = bin_dir / "dmesg"
    log.write_text(f"#!{sys.executable}\n{Path(dmesg.__file__).read_text()}")
    os.chmod(log, 0o755)
    nvidia_smi.write_inventory(
        gpu_dir, nvidia_smi.make_inventory(gpus, gpu_memory_mib, gpu_name, seed=str(root)))

    config, log_file = root / "sshd_config", root / "sshd.log"
    last_error: SandboxError | None = None
    for _attempt in range(3):  # the free port can be taken between probe and bind: retry
        port = free_port()
        config.write_text(_sshd_config(root, port, host_key, authorized, user,
                                       log_level=log_level, max_sessions=max_sessions))
        box = SandboxBox(
            name=name, root=root, host="127.0.0.1", port=port, user=user,
            identity_file=client_key, known_hosts=root / "known_hosts", workdir=workdir,
            bin_dir=bin_dir, gpu_dir=gpu_dir, gpus=gpus, gpu_memory_mib=gpu_memory_mib,
            sshd_config=config, log_file=log_file,
        )
        try:
            box.start()
            return box
        except SandboxError as e:
            last_error = e
            if "Address already in use" not in str(e):
                raise
    assert last_error is not None
    raise last_error
