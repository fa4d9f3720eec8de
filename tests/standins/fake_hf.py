"""Stand-in for the hub CLI: ``hf download REPO [--local-dir D] [--revision R]
[--repo-type dataset] [--include PATTERN]...``.

The "hub" is a local folder, ``$FAKE_HF_HUB``: models under ``<hub>/<ORG>/<NAME>/``, data sets
under ``<hub>/datasets/<ORG>/<NAME>/``; a revision other than ``main`` is a sub-folder
``@<REV>`` of the repo. What it reproduces of the real CLI (huggingface_hub ≥ 0.34):
- a tqdm bar on stderr redrawn with ``\\r`` (``Fetching N files: ...``), then the local dir on
  stdout;
- the token comes from ``HF_TOKEN`` in the environment; when ``FAKE_HF_TOKEN_SHA256`` is set and
  the token's sha256 differs, it fails like the hub's 401 (``401 Client Error: Unauthorized``);
- a missing repo fails like ``RepositoryNotFoundError`` (``404 Client Error``), exit 1.
``FAKE_HF_ARGV_LOG``, when set, gets the argv as one JSON line (tests check no token is there).
Standard library only; never imports outrig.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import shutil
import sys
import time


def main(argv: list[str]) -> int:
    log = os.environ.get("FAKE_HF_ARGV_LOG")
    if log:
        with open(log, "a") as f:
            f.write(json.dumps(argv) + "\n")
    if not argv or argv[0] != "download" or len(argv) < 2:
        print("usage: hf download REPO [--local-dir DIR] ...", file=sys.stderr)
        return 2
    repo = argv[1]
    opts: dict[str, list[str]] = {}
    i = 2
    while i < len(argv):
        key = argv[i]
        if not key.startswith("--") or i + 1 >= len(argv):
            print(f"hf: unexpected argument {key!r}", file=sys.stderr)
            return 2
        opts.setdefault(key, []).append(argv[i + 1])
        i += 2
    expect = os.environ.get("FAKE_HF_TOKEN_SHA256")
    token = os.environ.get("HF_TOKEN", "")
    kind = (opts.get("--repo-type") or ["model"])[-1]
    url = f"https://huggingface.co/api/{kind}s/{repo}/revision/main"
    if expect and hashlib.sha256(token.encode()).hexdigest() != expect:
        print(f"huggingface_hub.errors.HfHubHTTPError: 401 Client Error: Unauthorized for url: "
              f"{url}\nInvalid credentials in Authorization header", file=sys.stderr)
        return 1
    hub = os.environ["FAKE_HF_HUB"]
    source = os.path.join(hub, "datasets", repo) if kind == "dataset" else os.path.join(hub, repo)
    revision = (opts.get("--revision") or ["main"])[-1]
    if revision != "main":
        source = os.path.join(source, f"@{revision}")
    if not os.path.isdir(source):
        print(f"huggingface_hub.errors.RepositoryNotFoundError: 404 Client Error. Repository Not "
              f"Found for url: {url}.", file=sys.stderr)
        return 1
    dest = (opts.get("--local-dir") or [os.path.join(os.getcwd(), repo.split("/")[-1])])[-1]
    patterns = opts.get("--include") or ["*"]
    files = sorted(
        os.path.relpath(os.path.join(root, n), source)
        for root, _, names in os.walk(source) for n in names
        if not os.path.relpath(os.path.join(root, n), source).startswith("@"))
    files = [f for f in files if any(fnmatch.fnmatch(f, p) for p in patterns)]
    for done, rel in enumerate(files, 1):
        target = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(os.path.join(source, rel), target)
        pct = 100 * done // max(1, len(files))
        sys.stderr.write(f"\rFetching {len(files)} files: {pct:3d}%|{'#' * (pct // 10):<10}| "
                         f"{done}/{len(files)} [00:00<00:00, 9.9it/s]")
        sys.stderr.flush()
        time.sleep(float(os.environ.get("FAKE_HF_DELAY", "0")))
    sys.stderr.write("\n")
    print(os.path.abspath(dest))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
