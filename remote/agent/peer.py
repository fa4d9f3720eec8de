"""Box-to-box copies: a throwaway key (``peer_keygen``) and ``peer_pull``, which runs this
same agent's ``send_files`` on the other box over ssh and receives its frames here."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shlex
import shutil
import subprocess

from .bundle import bootstrap_argv, build_bundle, digest_of, pack, package_sources
from .constants import JSONDict
from .events import AgentError, Emitter
from .layout import Layout, write_atomic
from .protocol import encode_request
from .transfer import KEY_TAG, FrameReceiver, _expect, _finish_receive
from .validation import Request, get_dict, get_int, get_name, get_opt_str, get_str


def _transfer_dir(req: Request, tag: str) -> str:
    return os.path.join(Layout(req.workdir).state, "transfer", tag)


def op_peer_keygen(req: Request, out: Emitter) -> JSONDict:
    """A throwaway key for pulling from a peer box (kept in the workdir, deleted after)."""
    tag = get_name(req.raw, "tag", "")
    folder = _transfer_dir(req, tag)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    key = os.path.join(folder, "id_ed25519")
    if not os.path.exists(key):
        exe = shutil.which("ssh-keygen")
        if exe is None:
            raise AgentError("no_ssh", "ssh-keygen is not installed on this box, so it cannot "
                             "pull from the other box directly (install openssh-client); "
                             "outrig will copy through the workstation instead")
        subprocess.run([exe, "-q", "-t", "ed25519", "-N", "", "-C", f"{KEY_TAG}{tag}",
                        "-f", key], check=True, stdin=subprocess.DEVNULL, capture_output=True)
    with open(key + ".pub", encoding="ascii") as f:
        return {"public_key": f.read().strip(), "has_ssh": shutil.which("ssh") is not None}


def op_peer_pull(req: Request, out: Emitter) -> JSONDict:
    """Pull files straight from a peer box over ssh, with the key from peer_keygen.

    The peer runs this same agent's ``send_files`` (the bundle running here travels in the
    command line) and its frames are consumed here exactly as a relayed stream would be.
    """
    raw = req.raw
    tag = get_name(raw, "tag", "")
    root = os.path.expanduser(get_str(raw, "root", ""))
    expect = _expect(raw)
    peer = get_dict(raw, "peer", "", required=True)
    host = get_str(peer, "host", "peer.")
    port = get_int(peer, "port", "peer.", 22, 1, 65535)
    user = get_opt_str(peer, "user", "peer.")
    known = get_str(peer, "known_hosts", "peer.")
    peer_python = get_str(peer, "python", "peer.")
    send_request = get_dict(raw, "send", "", required=True)
    folder = _transfer_dir(req, tag)
    key = os.path.join(folder, "id_ed25519")
    known_file = os.path.join(folder, "known_hosts")
    write_atomic(known_file, (known.strip() + "\n").encode("ascii"), 0o600)
    bundle = build_bundle(package_sources())  # exactly the agent running here
    remote = " ".join(shlex.quote(x) for x in bootstrap_argv(
        peer_python, digest_of(bundle), str(send_request.get("workdir") or ""),
        base64.b64encode(pack(bundle)).decode("ascii"),
        encode_request(json.dumps(send_request).encode())))
    exe = shutil.which("ssh")
    if exe is None:
        raise AgentError("no_ssh", "ssh is not installed on this box (install openssh-client)")
    argv = [exe, "-i", key, "-p", str(port), "-o", "BatchMode=yes",
            "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={known_file}",
            "-o", "ConnectTimeout=15", "-o", "ServerAliveInterval=10",
            "-o", "ServerAliveCountMax=3", "-o", "IdentitiesOnly=yes",
            f"{user}@{host}" if user else host, remote]
    os.makedirs(root, exist_ok=True)
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    try:
        result = FrameReceiver(root, expect, out).consume(proc.stdout)
    except AgentError as exc:
        proc.kill()
        err = proc.stderr.read().decode("utf-8", errors="replace").strip().splitlines()
        raise AgentError(exc.kind if not err else "peer", exc.message
                         + (f" (ssh said: {err[-1]})" if err else "")) from None
    finally:
        with contextlib.suppress(OSError):
            proc.stdout.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(folder, ignore_errors=True)
    _finish_receive(root, raw, expect)
    return result
