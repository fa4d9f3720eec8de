#!/usr/bin/env python3
"""Provision benchmark: the same requirements installed with pip and with uv, side by side.

Starts the sandbox box (a real OpenSSH sshd on 127.0.0.1) and runs ``provision`` through it,
as on a fresh box: a new venv each time, from the package index the machine reaches (PyPI
by default; pip's config files are switched off with PIP_CONFIG_FILE=/dev/null so that both
installers see the same index and nothing else; the system CA bundle is given as PIP_CERT,
which uv receives as SSL_CERT_FILE). For each installer:
- cold: an empty download/build cache (PIP_CACHE_DIR / UV_CACHE_DIR set to a new folder);
- warm: a new venv again, with the cache the cold run filled.
uv comes from the bootstrap venv provision makes under the workdir's .outrig folder (``pip
install uv`` from the same index); that one-time cost is timed on its own. The figure per run
is the environment's ``seconds`` as the agent reports it (venv creation, install, checks) and
its ``install_seconds`` (the install alone).

Usage:  python bench/provision_installers.py [--repeat 2] [--packages P ...] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# A typical service/tooling environment: a few pure-Python packages and two with compiled
# wheels (numpy, pydantic-core), 20-odd distributions with their dependencies.
PACKAGES = ["requests==2.32.3", "pydantic==2.9.2", "rich==13.9.4", "numpy==2.1.3",
            "PyYAML==6.0.2", "Jinja2==3.1.4", "httpx==0.27.2"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--packages", nargs="+", default=PACKAGES)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    import yaml

    from outrig.console import Reporter
    from outrig.journal import Journal
    from outrig.ops.provision import provision
    from outrig.sandbox.box import start_sandbox
    from outrig.session import Project

    root = Path(tempfile.mkdtemp(prefix="outrig-bench-provision-"))
    os.environ["XDG_STATE_HOME"] = str(root / "state")
    box = start_sandbox(root / "box")
    project = Project(REPO)
    journal = Journal(root / "state" / "outrig")
    quiet = Reporter(quiet=True)
    rows: list[dict[str, Any]] = []
    bootstrap: dict[str, Any] = {}
    counter = 0
    cert = os.environ.get("PIP_CERT") or next(
        (c for c in ("/etc/ssl/certs/ca-certificates.crt",) if os.path.exists(c)), None)

    def run(installer: str, cache: Path) -> dict[str, Any]:
        nonlocal counter
        counter += 1
        config: dict[str, Any] = box.host_config(workdir=root / "workdir")
        config["env"] = {**dict(config["env"]), "PIP_CONFIG_FILE": os.devnull,
                         "PIP_CACHE_DIR": str(cache / "pip"), "UV_CACHE_DIR": str(cache / "uv")}
        if cert:  # a TLS-inspecting proxy's CA: pip gets it as PIP_CERT, uv as SSL_CERT_FILE
            config["env"]["PIP_CERT"] = cert
        host = root / "hosts" / f"bench{counter}.yaml"
        host.parent.mkdir(parents=True, exist_ok=True)
        host.write_text(yaml.safe_dump(config))
        venv = root / "venvs" / f"{installer}-{counter}"
        book = {"name": "bench", "processes": {"noop": {"command": "true"}},
                "environments": {"bench": {"path": str(venv), "python": sys.executable,
                                           "packages": list(args.packages),
                                           "installer": installer}}}
        playbook = root / f"bench{counter}.yaml"
        playbook.write_text(yaml.safe_dump(book))
        started = time.monotonic()
        result = provision(project, str(host), quiet, playbook=str(playbook), journal=journal)
        wall = time.monotonic() - started
        [env] = result.environments
        installers = [e for e in result.events if e.get("event") == "installer"]
        shutil.rmtree(venv, ignore_errors=True)
        first_event = installers[0] if installers else {}
        return {"installer": env.get("installer"), "env_seconds": float(env["seconds"]),
                "install_seconds": float(env.get("install_seconds") or 0.0),
                "wall_seconds": round(wall, 2), "source": first_event.get("source"),
                "bootstrap_seconds": first_event.get("bootstrap_seconds")}

    try:
        (root / "workdir").mkdir()
        # The uv bootstrap, once (and timed alone): a venv plus `pip install uv`.
        first = run("uv", root / "cache-bootstrap")
        bootstrap = {"seconds": first["bootstrap_seconds"], "source": first["source"]}
        for repeat in range(args.repeat):
            for installer in ("pip", "uv"):
                cache = root / f"cache-{installer}-{repeat}"
                cold = run(installer, cache)
                warm = run(installer, cache)
                rows.append({"repeat": repeat, "installer": installer, "cache": "cold", **cold})
                rows.append({"repeat": repeat, "installer": installer, "cache": "warm", **warm})
    finally:
        box.stop()
        shutil.rmtree(root, ignore_errors=True)

    table: dict[str, dict[str, float]] = {}
    for installer in ("pip", "uv"):
        for cache in ("cold", "warm"):
            chosen = [r for r in rows if r["installer"] == installer and r["cache"] == cache]
            table.setdefault(installer, {})[cache] = round(
                statistics.median(r["env_seconds"] for r in chosen), 2)
            table[installer][f"{cache}_install"] = round(
                statistics.median(r["install_seconds"] for r in chosen), 2)
    summary = {"packages": args.packages, "repeat": args.repeat, "median_seconds": table,
               "uv_bootstrap": bootstrap, "runs": rows}
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"provision of a new venv with {len(args.packages)} requirement(s) "
              f"(median of {args.repeat}; seconds as the agent reports them)")
        print(f"  {'':6} {'cold: env':>10} {'install':>8} {'warm: env':>10} {'install':>8}")
        for installer in ("pip", "uv"):
            row = table[installer]
            print(f"  {installer:6} {row['cold']:10.2f} {row['cold_install']:8.2f} "
                  f"{row['warm']:10.2f} {row['warm_install']:8.2f}")
        print(f"  uv speed-up of the install: cold "
              f"{table['pip']['cold_install'] / table['uv']['cold_install']:.1f}x, warm "
              f"{table['pip']['warm_install'] / table['uv']['warm_install']:.1f}x")
        print(f"  uv bootstrap (venv + pip install uv, once per box): "
              f"{bootstrap['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
