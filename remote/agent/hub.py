"""The ``hub_download`` op: the box fetches a model or data set from the hub itself, with the
token only in the child's environment (docs/provision.md)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
import time
from typing import List, Optional, Tuple

from .children import DISK_PATTERNS, NO_INTERNET_PATTERNS, run_streaming
from .constants import EXCERPT_LINES, JSONDict
from .events import AgentError, Emitter, bad_request
from .reach import HUB_CONNECT_TIMEOUT_S, hub_endpoint, hub_reachable
from .validation import Request, get_bool, get_num, get_opt_str, get_str, get_str_dict, get_str_list

HUB_REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")


def find_hub_client(python: Optional[str]) -> Optional[Tuple[str, str]]:
    """(path, flavour) of the hub CLI: ``hf`` (huggingface_hub ≥ 0.34), else the older
    ``huggingface-cli``; next to the given interpreter (its venv's bin, not resolving the
    symlink) first, then on PATH."""
    dirs: List[str] = []
    if python:
        exe = python if os.sep in python else shutil.which(python)
        if exe:
            dirs.append(os.path.dirname(os.path.abspath(exe)))
    for name in ("hf", "huggingface-cli"):
        for d in dirs:
            cand = os.path.join(d, name)
            if os.path.isfile(cand) and os.access(cand, os.X_OK):
                return cand, name
    for name in ("hf", "huggingface-cli"):
        found = shutil.which(name, path=os.environ.get("PATH", os.defpath))
        if found:
            return found, name
    return None


def hub_failure(repo: str, kind: str, code: int, lines: List[str], has_token: bool,
                endpoint: str) -> AgentError:
    """Map the hub CLI's output to ``auth`` / ``not_found`` / ``no_internet`` / ``disk`` /
    ``hub`` with a fix."""
    text = "\n".join(lines)
    excerpt = lines[-EXCERPT_LINES:]
    what = f"{'dataset' if kind == 'dataset' else 'model'} {repo}"
    token_hint = ("the HF_TOKEN sent was refused or lacks access: check it on "
                  "huggingface.co/settings/tokens and accept the repo's licence with that account"
                  if has_token else "no HF_TOKEN was sent: export HF_TOKEN on the workstation "
                  "(it travels over the SSH channel only)")
    if any(p in text for p in DISK_PATTERNS):
        return AgentError("disk", f"the disk filled up downloading {what}; free space and run "
                                  "again (the download resumes)", excerpt=excerpt, exit_code=code)
    missing = re.search(r"RepositoryNotFoundError|Repository Not Found|RevisionNotFound|"
                        r"Revision Not Found|EntryNotFound|\b404\b", text)
    if not missing and re.search(r"\b40[13]\b|GatedRepoError|Invalid (user )?token|"
                                 r"Invalid credentials|Unauthorized|Forbidden|"
                                 r"Access to model .* is restricted", text):
        return AgentError("auth", f"the hub refused access to {what}: {token_hint}",
                          excerpt=excerpt, exit_code=code)
    if missing:
        extra = "" if has_token else (" (a private or gated repo also looks like this without "
                                      "HF_TOKEN)")
        return AgentError("not_found", f"{what} (or that revision) does not exist on "
                                       f"{endpoint}{extra}; check the id, the revision and, for "
                                       "a data set, use hf-dataset:", excerpt=excerpt,
                          exit_code=code)
    if any(p in text for p in NO_INTERNET_PATTERNS):
        return AgentError("no_internet", f"the box lost its connection to {endpoint} while "
                                         f"downloading {what}; run again to resume, or stage it "
                                         "through another route", excerpt=excerpt,
                          exit_code=code)
    return AgentError("hub", f"downloading {what} failed (exit {code}); see the last lines",
                      excerpt=excerpt, exit_code=code)


def dir_totals(path: str) -> Tuple[int, int]:
    """(files, bytes) under ``path``, not counting the hub client's own ``.cache`` folder."""
    files = total = 0
    for root, dirs, names in os.walk(path):
        dirs[:] = [d for d in dirs if not (root == path and d == ".cache")]
        for name in names:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
                files += 1
    return files, total


def op_hub_download(req: Request, out: Emitter) -> JSONDict:
    """Fetch a hub repo into ``dest`` on the box with the hub's own CLI (token from secrets)."""
    raw = req.raw
    probe_only = get_bool(raw, "probe_only", "", False)
    secrets = get_str_dict(raw, "secrets", "")
    python = get_opt_str(raw, "python", "") or sys.executable
    host, port, url = hub_endpoint(get_opt_str(raw, "endpoint", ""))
    reachable, why = hub_reachable(host, port)
    client = find_hub_client(python)
    result: JSONDict = {"hub_reachable": reachable, "endpoint": url,
                        "client": client[0] if client else None,
                        "client_kind": client[1] if client else None}
    if probe_only:
        result["reach_error"] = why or None
        return result
    repo = get_str(raw, "repo_id", "")
    if not HUB_REPO_RE.match(repo):
        raise bad_request(f"repo_id: {repo!r} is not a hub id like 'Qwen/Qwen3-8B'")
    revision = get_opt_str(raw, "revision", "")
    kind = raw.get("kind") or "model"
    if kind not in ("model", "dataset"):
        raise bad_request("kind: must be 'model' or 'dataset'")
    dest = os.path.normpath(os.path.expanduser(get_str(raw, "dest", "")))
    if not os.path.isabs(dest):
        raise bad_request(f"dest: {dest!r} must be an absolute path (or start with ~)")
    patterns = get_str_list(raw, "allow_patterns", "")
    interval = get_num(raw, "progress_interval", "", 1.0, positive=True)
    if not reachable:
        raise AgentError("no_internet", f"the box cannot reach the hub ({why}; tried for "
                                        f"{HUB_CONNECT_TIMEOUT_S:g} s). Stage {repo} another way "
                                        "(from another host or through the workstation), or fix "
                                        "the box's network / HF_ENDPOINT")
    if client is None:
        raise AgentError("no_hub_client", f"no hub client on the box: neither 'hf' nor "
                                          f"'huggingface-cli' next to {python} or on PATH. Add "
                                          "huggingface_hub to an environment of the playbook "
                                          "(environments: ... packages: [huggingface_hub==X]), "
                                          "run `outrig provision`, and pass that environment's "
                                          "python")
    exe, flavour = client
    argv = [exe, "download", repo, "--local-dir", dest]
    if revision:
        argv += ["--revision", revision]
    if kind == "dataset":
        argv += ["--repo-type", "dataset"]
    if patterns:  # hf (typer) repeats the option; huggingface-cli (argparse) takes a list
        if flavour == "hf":
            for pattern in patterns:
                argv += ["--include", pattern]
        else:
            argv += ["--include", *patterns]
    try:
        os.makedirs(dest, exist_ok=True)
    except OSError as exc:
        raise AgentError("dest", f"cannot create {dest}: {exc.strerror}; pick a writable path "
                                 "or fix its permissions") from None
    env = dict(os.environ)
    env.pop("HF_HUB_OFFLINE", None)  # a launch setting; this step exists to go online
    env.pop("TRANSFORMERS_OFFLINE", None)
    env.update(secrets)  # HF_TOKEN: in the child's environment only, never argv or events
    env["PYTHONUNBUFFERED"] = "1"
    out.step(f"downloading {kind} {repo}{'@' + revision if revision else ''} into {dest} "
             f"with {flavour}")
    started = time.monotonic()
    code, lines = run_streaming(argv, out, interval, {"repo_id": repo, "phase": "hub"},
                                env=env, secrets=list(secrets.values()))
    if code != 0:
        raise hub_failure(repo, kind, code, lines, bool(secrets.get("HF_TOKEN")), url)
    files, total = dir_totals(dest)
    result.update(repo_id=repo, revision=revision, kind=kind, dest=dest, files=files,
                  bytes=total, seconds=round(time.monotonic() - started, 2))
    return result
