"""``inv provision``: make the playbook's environments right on a box, in one agent exec.

The agent (``op: provision``) checks python, the NVIDIA driver and free disk against the
playbook's ``requires:``, asks each environment's own interpreter what it has installed, and
runs ``python -m venv`` / ``pip install`` only where a pin is not met. A box that is already
right costs that one exec (~2 RTT plus a fraction of a second on the box), which is what makes
``provision`` safe to run before every ``deploy`` or inside ``migrate``. Installed versions go to
the journal (``hosts/<host>.json`` → ``environments``), including environments that failed.
See docs/provision.md.
"""

from __future__ import annotations

import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

from outrig.console import Reporter
from outrig.errors import ConfigError
from outrig.inventory import HostBook
from outrig.journal import Journal
from outrig.playbook import Job, find_playbook, load_job
from outrig.session import HostSession, Project, host_session

RECORDED = {"ok", "created", "updated", "failed"}
PHASES = {"venv": "creating venv", "pip": "pip install", "uv": "uv pip install",
          "uv-bootstrap": "installing uv"}


@dataclass
class ProvisionResult:
    """What the agent said: per-environment reports, the checks, and whether it was a dry run."""

    environments: list[dict[str, Any]] = field(default_factory=list)
    checks: dict[str, Any] = field(default_factory=dict)
    dry_run: bool = False
    seconds: float = 0.0
    events: list[dict[str, Any]] = field(default_factory=list)


def playbooks_with_environments(project: Project) -> list[str]:
    """Names of the playbooks in playbooks/ that declare ``environments:`` (unreadable ones are
    skipped: this only helps pick a default)."""
    names = []
    for path in sorted(project.playbooks_dir.glob("*.y*ml")):
        try:
            job = load_job(path)
        except Exception:  # a broken playbook must not break the hint
            continue
        if job.spec.environments:
            names.append(path.stem)
    return names


def pick_playbook(project: Project, playbook: str | None) -> Job:
    """The named playbook, or the only one in playbooks/ with ``environments:``."""
    if playbook is None:
        candidates = playbooks_with_environments(project)
        if len(candidates) != 1:
            listed = ", ".join(candidates) if candidates else "none has environments: yet"
            raise ConfigError(f"name the playbook whose environments to set up: --playbook P "
                              f"(playbooks with environments: {listed}). Nothing was sent.")
        playbook = candidates[0]
    job = load_job(find_playbook(playbook, project.playbooks_dir))
    if not job.spec.environments and job.spec.requires is None:
        raise ConfigError(
            f"playbook {job.doc.path} declares no "
            "environments: and no requires:, so there is nothing to provision. Add e.g.\n"
            "  environments:\n    vllm: {path: /workspace/venvs/vllm, python: python3.12, "
            "packages: [vllm==0.33.0]}\n(see docs/provision.md). Nothing was sent.")
    return job


def index_secrets(job: Job) -> dict[str, str]:
    """The credentials inside the environments' index URLs (``https://user:TOKEN@host/...``).
    A request with secrets goes over stdin, never the box's argv, and the agent redacts their
    values from every line it sends back (docs/agent-protocol.md)."""
    found: dict[str, str] = {}
    for name, spec in job.spec.environments.items():
        for number, url in enumerate([spec.index_url, *spec.extra_index_urls]):
            parsed = urllib.parse.urlsplit(url or "")
            secret = parsed.password or (parsed.username if "@" in parsed.netloc else None)
            if secret:
                found[f"INDEX_{name}_{number}"] = secret
    return found


def provision_request(job: Job, *, dry_run: bool) -> dict[str, Any]:
    """The agent request (docs/provision.md)."""
    requires = job.spec.requires.to_request() if job.spec.requires else {}
    request: dict[str, Any] = {
        "environments": [spec.to_request(name) for name, spec in job.spec.environments.items()],
        "requires": requires, "dry_run": dry_run, "progress_interval": 1.0, "lock_timeout": 30}
    secrets = index_secrets(job)
    if secrets:
        request["secrets"] = secrets
    return request


def record_environments(journal: Journal, host: str, reports: list[dict[str, Any]]) -> None:
    """Merge what the box said into the journal's host record (``environments``)."""
    known = journal.host_facts(host).get("environments")
    merged: dict[str, Any] = dict(known) if isinstance(known, dict) else {}
    for report in reports:
        if report.get("status") not in RECORDED or not isinstance(report.get("name"), str):
            continue
        merged[report["name"]] = {
            "path": report.get("path"), "status": report.get("status"),
            "python": report.get("python"), "versions": report.get("versions") or {},
            "seconds": report.get("seconds"), "installer": report.get("installer"),
            "checked": time.time()}
    journal.update_host(host, environments=merged)


def describe_report(report: dict[str, Any]) -> str:
    """``vllm (/workspace/venvs/vllm): created in 93.1s with uv — vllm 0.33.0, torch 2.14.0``."""
    versions = ", ".join(f"{k} {v}" for k, v in sorted((report.get("versions") or {}).items()))
    status = str(report.get("status"))
    seconds = report.get("seconds")
    timing = f" in {float(seconds):.1f}s" if isinstance(seconds, (int, float)) else ""
    installer = f" with {report['installer']}" if report.get("installer") else ""
    text = (f"{report.get('name')} ({report.get('path')}): {status.replace('_', ' ')}"
            f"{timing}{installer}")
    missing = report.get("missing") or {}
    if status.startswith("would") and missing:
        text += " — needs " + ", ".join(f"{k} (now {v or 'missing'})"
                                        for k, v in sorted(missing.items()))
    elif versions:
        text += f" — {versions}"
    return text


def describe_installer(event: dict[str, Any]) -> str:
    """``train: installing with uv (/usr/bin/uv, on PATH)`` or ``... with pip: <why not uv>``."""
    name = event.get("env")
    if event.get("installer") == "uv":
        where = {"path": "on PATH", "bootstrap": "bootstrap venv",
                 "bootstrapped": "bootstrap venv, just made"}.get(str(event.get("source")), "")
        return f"{name}: installing with uv ({event.get('uv')}, {where})"
    fallback = event.get("fallback")
    return f"{name}: installing with pip" + (f" ({fallback})" if fallback else "")


def describe_checks(checks: dict[str, Any]) -> str:
    """``• checks: driver 580.159.04 (needs >=580), 75.1 GB free at /workspace (needs 100)``."""
    parts = []
    driver = checks.get("driver") or {}
    if driver.get("driver") or driver.get("required"):
        parts.append(f"driver {driver.get('driver') or '?'}"
                     + (f" (needs {driver['required']})" if driver.get("required") else ""))
    python = checks.get("python") or {}
    if python.get("required"):
        parts.append(f"python needs {python['required']}")
    for disk in checks.get("disk") or []:
        need = disk.get("required_gb")
        parts.append(f"{disk.get('free_gb')} GB free at {disk.get('checked_at')}"
                     + (f" (needs {need:g})" if isinstance(need, (int, float)) else ""))
    return "• checks: " + ("; ".join(parts) if parts else "nothing required")


def provision(project: Project, host_spec: str, reporter: Reporter, *,
              playbook: str | None = None, dry_run: bool = False,
              journal: Journal | None = None, book: HostBook | None = None) -> ProvisionResult:
    """Check the box and make every environment of the playbook right (one agent exec)."""
    job = pick_playbook(project, playbook)
    with host_session(project, host_spec, reporter, journal, book=book) as session:
        return provision_on(session, job, dry_run=dry_run)


def provision_on(session: HostSession, job: Job, *, dry_run: bool = False) -> ProvisionResult:
    """:func:`provision` of a loaded playbook on an open session."""
    reporter, journal, host_spec = session.reporter, session.journal, session.host_spec
    request = provision_request(job, dry_run=dry_run)
    started = time.monotonic()
    reports: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    phase_started: dict[str, float] = {}

    def handle(event: dict[str, Any]) -> None:
        events.append(event)
        kind = event.get("event")
        if kind == "environment":
            reports.append(event)
        if reporter.json_mode:
            reporter.event(event)
            return
        if kind == "progress":
            name = str(event.get("env") or "?")
            phase_started.setdefault(name, time.monotonic())
            elapsed = float(event.get("elapsed") or 0)
            last = str(event.get("line") or "")[-110:]
            what = PHASES.get(str(event.get("phase")), "pip install")
            reporter.live(f"{name}: {what} {elapsed:.0f}s" + (f" — {last}" if last else ""))
        elif kind == "installer" and event.get("fallback"):
            reporter.warn(describe_installer(event))
        elif kind == "installer":
            reporter.info(f"• {describe_installer(event)}")
        elif kind == "environment":
            text = describe_report(event)
            if event.get("status") == "failed":
                reporter.warn(text)
            elif event.get("status") in RECORDED:
                reporter.success(text)
            else:
                reporter.info(f"• {text}")
        else:
            reporter.event(event)

    names = ", ".join(job.spec.environments) or "no environments (checks only)"
    reporter.info(f"• provisioning {session.host.name} for {job.name}: {names}"
                  + (" (dry run: nothing is installed)" if dry_run else ""))
    try:
        result = session.call("provision", handler=handle, **request)
    finally:
        if not dry_run or reports:
            record_environments(journal, session.host.name,
                                [r for r in reports if r.get("status") in RECORDED])
    outcome = ProvisionResult(environments=list(result.get("environments") or []),
                              checks=dict(result.get("checks") or {}),
                              dry_run=bool(result.get("dry_run")),
                              seconds=time.monotonic() - started, events=events)
    summary = {"event": "provisioned", "ok": True, "host": host_spec, "playbook": job.name,
               "dry_run": outcome.dry_run, "seconds": round(outcome.seconds, 3),
               "checks": outcome.checks, "environments": outcome.environments}
    reporter.emit_json(summary)
    reporter.info(describe_checks(outcome.checks))
    changed = [r["name"] for r in outcome.environments if r.get("status") in {"created", "updated"}]
    if dry_run:
        pending = [r["name"] for r in outcome.environments if str(r.get("status")).startswith(
            "would")]
        reporter.info("dry run: nothing was installed; "
                      + (f"would set up {', '.join(pending)}" if pending else "all already right"))
    else:
        reporter.success(f"{host_spec} provisioned for {job.name} in {outcome.seconds:.1f}s"
                         + (f" (set up: {', '.join(changed)})" if changed
                            else " (everything was already right)"))
    return outcome
