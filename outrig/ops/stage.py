"""``inv stage`` and ``inv sync-checkpoints``: put model, data and checkpoints where a job needs
them, by the fastest route, verified, resumable.

Route per item, first that applies:
1. ``present``: the box already holds it and its stage mark still matches (sizes and mtimes of
   every file recorded with its sha256). A re-run costs one agent exec and moves nothing.
2. ``hub``: the source is ``hf:…`` and the box reaches the hub: the box downloads it itself
   with the HF token passed over the channel (never argv).
3. ``peer``: ``--from OLD`` holds it and the new box can ssh to the old one: the new box pulls
   straight from the old one with a throwaway key (authorised on OLD for the copy, then
   removed). 50 GB never cross the workstation's slow link.
4. ``relay``: ``--from OLD`` holds it but the boxes cannot see each other: the workstation
   pumps OLD's stream into NEW (parallel streams).
5. ``workstation``: the source is a folder here (or the checkpoint mirror): pushed in
   parallel streams.

Every copy goes through part files verified by size and sha256, so a cut resumes where it
stopped, and an item gets its stage mark only when every file is verified.
"""

from __future__ import annotations

import hashlib
import secrets as _secrets
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from outrig import recipes
from outrig.agent_code import transfer as box_transfer
from outrig.checkpoints import (
    Checkpoint,
    assess,
    checkpoint_order,
    listing_request,
    newest_complete,
    order_text,
    state_order,
)
from outrig.console import Reporter
from outrig.errors import ConfigError, OutrigError, RemoteError
from outrig.formats.hub_source import parse_hub_source
from outrig.formats.template import UndefinedName, substitute
from outrig.inventory import Host, HostBook
from outrig.journal import Journal, read_json, state_dir
from outrig.ops.runs import pick_host_run
from outrig.plan import builtin_params
from outrig.playbook import Job, find_playbook, load_job, resolve_playbook
from outrig.session import HostSession, Project, host_session
from outrig.transfer import (
    STREAMS,
    Events,
    Manifest,
    Meter,
    Source,
    box_source,
    copy,
    diff,
    human_bytes,
    local_source,
    to_box,
    to_local,
)
from outrig.transport import known_hosts_path


class NoCheckpoint(OutrigError):
    """There is no complete checkpoint to resume from (anywhere we looked)."""


@dataclass(frozen=True)
class StageItem:
    name: str
    path: str
    source: str | None
    kind: str
    optional_because: str | None = None  # when set, a missing source is a note, not an error


def stage_items(job: Job, host: Host) -> list[StageItem]:
    """The folders a job needs: the recipe's (model, data, checkpoints) plus ``stage:``."""
    params: dict[str, object] = {**job.spec.params, **builtin_params(host, job, "stage")}
    items: dict[str, StageItem] = {}
    for given in recipes.stage_items(job.spec.recipe, job.spec.recipe_section()):
        items[given.name] = StageItem(given.name, given.path, given.source, given.kind,
                                      given.optional_because)
    for name, spec in job.spec.stage.items():
        items[name] = StageItem(name, spec.path, spec.source, spec.kind)
    out = []
    for item in items.values():
        try:
            path = substitute(item.path, params)
        except UndefinedName as exc:
            raise ConfigError(f"{job.doc.path}: stage item {item.name}: ${{{exc}}} is not defined "
                              "(run-specific names such as run_dir cannot be staged)") from None
        if not path.startswith(("/", "~")):
            raise ConfigError(f"{job.doc.path}: stage item {item.name}: {path!r} is not an "
                              "absolute path once its ${names} are filled in")
        out.append(StageItem(item.name, path, item.source, item.kind, item.optional_because))
    return out


def family(job: Job) -> str:
    """The job a playbook belongs to (variants for other hardware share it)."""
    return job.spec.family or job.name


def mirror_root(name: str) -> Path:
    """Where ``sync-checkpoints`` keeps a playbook family's checkpoints on this workstation."""
    return state_dir() / "checkpoints" / name


# ----------------------------------------------------------------------------------- pieces


def box_manifest(session: HostSession, items: list[tuple[str, str]], *,
                 verify: bool = False) -> dict[str, dict[str, Any]]:
    """One exec: what each (name, path) holds on the box (files, partial files, stage mark)."""
    result = session.call("manifest", stream=False,
                          items=[{"name": n, "path": p, "verify": verify} for n, p in items])
    return {entry["name"]: entry for entry in result["items"]}


def manifest_cache(state: Path, root: Path) -> Path:
    """Where the workstation caches the sha256 sums of a local folder: in outrig's state dir,
    keyed by the folder's absolute path, so staging never writes into the user's folder."""
    key = hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:24]
    return state / "manifests" / f"{key}.json"


def local_manifest(root: Path, state: Path) -> dict[str, Any]:
    """A workstation folder's files (size, mtime, sha256), its partial files and stage mark."""
    if not root.is_dir():
        return {"exists": False, "files": {}, "partial": {}, "staged": False}
    mark = box_transfer.staged_record(str(root))
    listing: dict[str, Any] = box_transfer.dir_manifest(str(root), True, Events(None),
                                                        str(manifest_cache(state, root)))
    return {"exists": True, "staged": mark is not None, **listing}


def _sources_files(listing: dict[str, Any]) -> Manifest:
    """What a copy must reproduce: size and sha256, and the mtime that the receiver gives
    each file (checkpoint completeness is judged by which file was written last)."""
    return {rel: {"size": info["size"], "sha256": info.get("sha256"),
                  **({"mtime_ns": info["mtime_ns"]} if "mtime_ns" in info else {})}
            for rel, info in (listing.get("files") or {}).items()}


class Stager:
    """Copies one folder at a time into a box or the local mirror, choosing the route."""

    def __init__(self, reporter: Reporter, journal: Journal, streams: int = STREAMS) -> None:
        if isinstance(streams, bool) or not isinstance(streams, int) or streams < 1:
            raise ConfigError(f"--streams {streams!r}: give a whole number of parallel streams "
                              "of at least 1 (default 4). Nothing was sent.")
        self.reporter = reporter
        self.journal = journal
        self.streams = streams
        self.routes: list[dict[str, Any]] = []

    def _meter(self, label: str, total: int) -> Meter:
        return Meter(total, self.reporter.live, label)

    def _into_box(self, source: Source, expect: Manifest, dest: HostSession, path: str,
                  dest_listing: dict[str, Any], label: str, source_label: str) -> dict[str, Any]:
        """Copy what the box lacks through the workstation, then mark the folder staged."""
        plan = diff(expect, _sources_files(dest_listing), dest_listing.get("partial") or {})
        moved = copy(source, plan, partial(to_box, session=dest, root=path),
                     self._meter(label, plan.bytes), self.streams) \
            if plan.files else {"bytes": 0, "files": 0, "seconds": 0.0, "streams": 0}
        dest.call("mark_staged", stream=False, root=path, expect=expect, source=source_label)
        return {**moved, "skipped": plan.skipped}

    def push_local(self, root: Path, dest: HostSession, path: str, dest_listing: dict[str, Any],
                   name: str, source_label: str) -> dict[str, Any]:
        """Workstation folder → box."""
        listing = local_manifest(root, self.journal.root)
        return self._into_box(local_source(root), _sources_files(listing), dest, path,
                              dest_listing, f"{name} → {dest.host.name}", source_label)

    def relay(self, src: HostSession, src_path: str, src_listing: dict[str, Any],
              dest: HostSession, path: str, dest_listing: dict[str, Any], name: str,
              source_label: str) -> dict[str, Any]:
        """Box → workstation → box, in parallel streams."""
        return self._into_box(box_source(src, src_path), _sources_files(src_listing), dest,
                              path, dest_listing, f"{name}: {src.host.name} → {dest.host.name}",
                              source_label)

    def peer(self, src: HostSession, src_path: str, src_listing: dict[str, Any],
             dest: HostSession, path: str, dest_listing: dict[str, Any], name: str,
             source_label: str) -> dict[str, Any]:
        """The destination box pulls straight from the source box over ssh."""
        expect = _sources_files(src_listing)
        plan = diff(expect, _sources_files(dest_listing), dest_listing.get("partial") or {})
        if not plan.files:
            dest.call("mark_staged", stream=False, root=path, expect=expect, source=source_label)
            return {"bytes": 0, "files": 0, "seconds": 0.0, "skipped": plan.skipped}
        tag = f"{int(time.time())}-{_secrets.token_hex(4)}"
        keys = dest.call("peer_keygen", stream=False, tag=tag)
        if not keys.get("has_ssh"):
            raise RemoteError("the new box has no ssh client", kind="no_ssh")
        src.call("authorize_key", stream=False, public_key=keys["public_key"], tag=tag)
        try:
            src_host = src.host
            address = src.transport.peer_address()  # after ~/.ssh/config, as connected
            host, port, user = address.host, address.port, address.user
            known = _known_line(src_host, host, port)
            meter = self._meter(f"{name}: {src.host.name} ⇒ {dest.host.name} (direct)",
                                plan.bytes)
            result = dest.call(
                "peer_pull", handler=meter, tag=tag, root=path, expect=expect,
                mark_staged=True, source=source_label,
                peer={"host": host, "port": port, "user": user, "known_hosts": known,
                      "python": src_host.python},
                send={"op": "send_files", "workdir": src_host.workdir,
                      "env": dict(src_host.env), "root": src_path, "files": plan.files})
        finally:
            try:
                src.call("revoke_key", stream=False, tag=tag)
            except OutrigError as exc:
                self.reporter.warn(f"could not remove the transfer key from {src.host.name} "
                                   f"(tag outrig-transfer:{tag}): {exc}; it expires in 6 h")
        return {**result, "skipped": plan.skipped}

    def pull_local(self, src: HostSession, src_path: str, src_listing: dict[str, Any],
                   root: Path, name: str) -> dict[str, Any]:
        """Box → workstation folder (the checkpoint mirror)."""
        expect = _sources_files(src_listing)
        here = local_manifest(root, self.journal.root)
        plan = diff(expect, _sources_files(here), here.get("partial") or {})
        moved = copy(box_source(src, src_path), plan, partial(to_local, root=root),
                     self._meter(f"{name} ← {src.host.name}", plan.bytes), self.streams) \
            if plan.files else {"bytes": 0, "files": 0, "seconds": 0.0}
        box_transfer.mark_staged(str(root), expect, f"{src.host.name}:{src_path}")
        return {**moved, "skipped": plan.skipped}


def _known_line(host: Host, address: str, port: int) -> str:
    """The source box's host key as the workstation recorded it, for the new box's ssh."""
    import paramiko

    name = address if port == 22 else f"[{address}]:{port}"
    keys = paramiko.HostKeys()
    path = known_hosts_path(host)
    if path.is_file():
        keys.load(str(path))
    system = Path("~/.ssh/known_hosts").expanduser()
    if system.is_file() and system != path:
        keys.load(str(system))
    entry = keys.lookup(name)
    if not entry:
        raise RemoteError(f"no recorded host key for {name}; connect once with outrig first",
                          kind="peer")
    key_type = next(iter(entry.keys()))
    return f"{name} {key_type} {entry[key_type].get_base64()}"


# --------------------------------------------------------------------------------- the ops


def _listing_fields(journal: Journal, host: str, playbook: str) -> dict[str, Any]:
    """``checkpoints`` op fields from the trainer argv of the host's newest run of the
    playbook (whether a scheduler file is expected, --max-steps)."""
    for run in journal.runs(host=host, playbook=playbook):
        for proc in (run.get("plan") or {}).get("processes") or []:
            if isinstance(proc, dict) and proc.get("name") == "trainer":
                return listing_request([str(a) for a in proc.get("argv") or []])
    return {}


def _load(project: Project, host: Host, playbook: str) -> tuple[Job, list[StageItem]]:
    job = load_job(find_playbook(playbook, project.playbooks_dir))
    return job, stage_items(job, host)


def stage(project: Project, host_spec: str, playbook: str, reporter: Reporter, *,
          from_host: str | None = None, resume: bool = False, journal: Journal | None = None,
          streams: int = STREAMS, source_playbook: str | None = None,
          parts: tuple[str, ...] = ("data", "checkpoint"),
          book: HostBook | None = None) -> dict[str, Any]:
    """Put every item of the playbook on ``host_spec``; with ``resume`` also the newest complete
    checkpoint (from ``from_host`` when given, else the local mirror). See :func:`stage_on`."""
    book = book or HostBook(project.hosts_dir)
    with host_session(project, host_spec, reporter, journal, book=book) as dest:
        src = HostSession(project, from_host, reporter, dest.journal,
                          host=book(from_host)) if from_host else None
        try:
            return stage_on(dest, playbook, src=src, resume=resume, streams=streams,
                            source_playbook=source_playbook, parts=parts)
        finally:
            if src is not None:
                src.close()


def stage_on(dest: HostSession, playbook: str | Job, *, src: HostSession | None = None,
             resume: bool = False, streams: int = STREAMS,
             source_playbook: str | Job | None = None,
             parts: tuple[str, ...] = ("data", "checkpoint")) -> dict[str, Any]:
    """:func:`stage` onto an open session, copying from the ``src`` session when given.

    ``source_playbook`` is the playbook the old box ran (a family member for other hardware),
    whose paths are the ones to read there. ``parts`` lets ``migrate`` stage data first and the
    checkpoint after it has stopped the old run. Either playbook may be a loaded job (a
    move's, rebuilt from the run's record: :mod:`outrig.redeploy`).
    """
    reporter, journal, project = dest.reporter, dest.journal, dest.project
    stager = Stager(reporter, journal, streams)
    job, items = (playbook, stage_items(playbook, dest.host)) if isinstance(playbook, Job) \
        else _load(project, dest.host, playbook)
    report: dict[str, Any] = {"host": dest.host_spec, "playbook": job.name, "items": []}
    if not items:
        raise ConfigError(f"playbook {job.name} names nothing to stage: add a stage: section "
                          "(or use a recipe that has model and data paths)")
    wanted = [i for i in items if i.kind != "checkpoints"] if "data" in parts else []
    listings = box_manifest(dest, [(i.name, i.path) for i in wanted]) if wanted else {}
    src_items: dict[str, StageItem] = {}
    src_job = job
    if src is not None:
        if isinstance(source_playbook, Job):
            src_job = source_playbook
        elif source_playbook:
            src_job = load_job(find_playbook(source_playbook, project.playbooks_dir))
        src_items = {i.name: i for i in stage_items(src_job, src.host)}
    for item in wanted:
        src_path = src_items[item.name].path if item.name in src_items else item.path
        outcome = _stage_item(stager, item, dest, listings[item.name], src,
                              src.host_spec if src is not None else None, src_path)
        report["items"].append(outcome)
        reporter.info(f"• {item.name}: {outcome['route']} — {_summary(outcome)}")
    if resume and "checkpoint" in parts:
        ckpt = next((i for i in items if i.kind == "checkpoints"), None)
        if ckpt is None:
            raise ConfigError(f"--resume: playbook {job.name} has no checkpoints item")
        src_ckpt = next((i.path for i in src_items.values()
                         if i.kind == "checkpoints"), ckpt.path)
        report["checkpoint"] = _stage_checkpoint(stager, job, ckpt, dest, src, journal,
                                                 reporter, src_ckpt, src_job.name)
    journal.update_host(dest.host.name, staged={i["name"]: i for i in report["items"]})
    if reporter.json_mode:
        reporter.emit_json(report)
    return report


def _summary(outcome: dict[str, Any]) -> str:
    if outcome["route"] == "skipped":
        return f"no source to copy from; {outcome.get('why')}"
    if outcome["route"] == "present":
        return f"already there and verified ({outcome.get('source') or 'unknown source'})"
    moved = float(outcome.get("bytes") or 0)
    secs = float(outcome.get("seconds") or 0)
    rate = f" at {human_bytes(moved / secs)}/s" if secs > 0 and moved else ""
    return (f"{human_bytes(moved)} in {secs:.1f}s{rate}, "
            f"{outcome.get('skipped', 0)} file(s) already there")


def _stage_item(stager: Stager, item: StageItem, dest: HostSession, listing: dict[str, Any],
                src: HostSession | None, from_host: str | None,
                src_path: str) -> dict[str, Any]:
    base = {"name": item.name, "path": item.path}
    if listing.get("staged"):
        return {**base, "route": "present", "source": listing.get("source"), "bytes": 0}
    hub = parse_hub_source(item.source, where=f"stage item {item.name}") if item.source else None
    tried: list[str] = []
    if hub is not None:
        from outrig.ops.hub_download import hub_download, hub_probe

        probe = hub_probe(dest)
        if probe.get("hub_reachable") and probe.get("client"):
            started = time.monotonic()
            result = hub_download(dest, hub, item.path, handler=lambda e: stager.reporter.live(
                f"{item.name} ← hub: {str(e.get('line') or '')[-100:]}"))
            listing = box_manifest(dest, [(item.name, item.path)], verify=True)[item.name]
            dest.call("mark_staged", stream=False, root=item.path,
                      expect=_sources_files(listing), source=str(hub))
            return {**base, "route": "hub", "bytes": result.get("bytes"),
                    "seconds": round(time.monotonic() - started, 3), "source": str(hub)}
        tried.append(f"hub: {probe.get('reach_error') or 'no hub client on the box'}")
    if src is not None:
        src_listing = box_manifest(src, [(item.name, src_path)], verify=False)[item.name]
        if src_listing.get("exists") and src_listing.get("files"):
            if not src_listing.get("staged"):
                src_listing = box_manifest(src, [(item.name, src_path)], verify=True)[item.name]
            label = f"{src.host.name}:{src_path}"
            try:
                moved = stager.peer(src, src_path, src_listing, dest, item.path, listing,
                                    item.name, label)
                return {**base, "route": "peer", **moved}
            except RemoteError as exc:
                tried.append(f"direct copy from {from_host}: {exc}")
                stager.reporter.warn(f"{item.name}: the boxes cannot copy directly ({exc}); "
                                     "relaying through this workstation")
            moved = stager.relay(src, src_path, src_listing, dest, item.path, listing,
                                 item.name, label)
            return {**base, "route": "relay", **moved}
        tried.append(f"{from_host} does not hold {src_path}")
    if item.source and hub is None:
        root = Path(item.source).expanduser()
        if root.is_dir():
            moved = stager.push_local(root, dest, item.path, listing, item.name, str(root))
            return {**base, "route": "workstation", **moved}
        tried.append(f"{root} is not a folder on this workstation")
    if item.optional_because:
        return {**base, "route": "skipped", "why": item.optional_because, "bytes": 0}
    raise OutrigError(
        f"cannot stage {item.name} ({item.path}) on {dest.host.name}: "
        + ("; ".join(tried) if tried else "it has no source")
        + ". Give it a source (hf:ORG/NAME or a folder here) under stage: in the playbook, "
        "or copy it from a box that has it with --from HOST."
    )


def _stage_checkpoint(stager: Stager, job: Job, item: StageItem, dest: HostSession,
                      src: HostSession | None, journal: Journal, reporter: Reporter,
                      src_save: str, src_playbook: str) -> dict[str, Any]:
    """The newest complete checkpoint into ``<save>/<epoch>/`` on the box."""
    if src is not None:
        listing = src.call("checkpoints", stream=False, save_path=src_save,
                           **_listing_fields(journal, src.host.name, src_playbook))
        best = newest_complete(listing)
        if best is not None:
            target = f"{item.path.rstrip('/')}/{best.epoch}"
            src_listing = box_manifest(src, [("ckpt", best.path)], verify=True)["ckpt"]
            dest_listing = box_manifest(dest, [("ckpt", target)])["ckpt"]
            if dest_listing.get("staged"):
                return {"epoch": best.epoch, "route": "present", "bytes": 0}
            label = f"{src.host.name}:{best.path}"
            try:
                moved = stager.peer(src, best.path, src_listing, dest, target, dest_listing,
                                    f"checkpoint {best.epoch}", label)
                route = "peer"
            except RemoteError as exc:
                reporter.warn(f"checkpoint: direct copy failed ({exc}); relaying")
                moved = stager.relay(src, best.path, src_listing, dest, target, dest_listing,
                                     f"checkpoint {best.epoch}", label)
                route = "relay"
            reporter.info(f"• checkpoint {best.epoch} from {src.host.name}: {route} — "
                          f"{_summary({'route': route, **moved})}")
            return {"epoch": best.epoch, "route": route, "from": src.host.name, **moved}
        reporter.warn(f"{src.host.name} has no complete checkpoint; looking in the mirror")
    mirror = mirror_root(family(job))
    epochs = sorted((int(p.name) for p in mirror.glob("*") if p.name.isdigit()
                     and box_transfer.staged_record(str(p)) is not None), reverse=True)
    if not epochs:
        raise NoCheckpoint(
            f"no complete checkpoint of {job.name} to resume from: "
            + (f"{src.host.name} has none, and " if src is not None else "")
            + f"the mirror {mirror} is empty. Run `outrig sync-checkpoints` while a box is alive, "
            "or deploy without resuming."
        )
    epoch = epochs[0]
    target = f"{item.path.rstrip('/')}/{epoch}"
    dest_listing = box_manifest(dest, [("ckpt", target)])["ckpt"]
    if dest_listing.get("staged"):
        return {"epoch": epoch, "route": "present", "bytes": 0}
    moved = stager.push_local(mirror / str(epoch), dest, target, dest_listing,
                              f"checkpoint {epoch}", f"mirror:{mirror / str(epoch)}")
    reporter.info(f"• checkpoint {epoch} from the mirror: "
                  f"{_summary({'route': 'workstation', **moved})}")
    return {"epoch": epoch, "route": "mirror", **moved}


def sync_checkpoints(project: Project, host_spec: str, reporter: Reporter, *,
                     playbook: str | None = None, journal: Journal | None = None,
                     streams: int = STREAMS, run_id: str | None = None,
                     book: HostBook | None = None) -> dict[str, Any]:
    """Pull every complete checkpoint the workstation's mirror lacks (incremental)."""
    with host_session(project, host_spec, reporter, journal, book=book) as session:
        return sync_checkpoints_on(session, playbook=playbook, streams=streams, run_id=run_id)


def sync_checkpoints_on(session: HostSession, *, playbook: str | None = None,
                        streams: int = STREAMS, run_id: str | None = None,
                        as_deployed: Job | None = None) -> dict[str, Any]:
    """:func:`sync_checkpoints` from an open session (``as_deployed``: the run's job as it
    was deployed, whose save path is read; default: today's file of its playbook).

    The mirror only moves forward: a checkpoint replaces the mirror's folder of its epoch
    only when it is newer (:func:`outrig.checkpoints.checkpoint_order`: a whole epoch after
    its mid-epoch saves), and from a run that a migrate moved away it takes nothing that is
    not the job's line (:func:`moved_refusal`)."""
    project, reporter, journal = session.project, session.reporter, session.journal
    host_spec = session.host_spec
    stager = Stager(reporter, journal, streams)
    # the run is looked up by the name its runs are filed under; the job is loaded from the
    # file --playbook names (a path stays a path: docs/cli.md, "Which run a command means")
    filed = None if playbook is None else resolve_playbook(playbook, project.playbooks_dir).name
    record = _synced_run(session, filed, run_id)
    name = playbook or str((record or {}).get("playbook"))
    job, items = _load(project, session.host, name) if as_deployed is None \
        else (as_deployed, stage_items(as_deployed, session.host))
    ckpt = next((i for i in items if i.kind == "checkpoints"), None)
    if ckpt is None:
        raise ConfigError(f"playbook {job.name} has no checkpoints item (stage: with "
                          "kind: checkpoints, or a recipe section's checkpoint folder)")
    listing = session.call("checkpoints", stream=False, save_path=ckpt.path,
                           **_listing_fields(journal, session.host.name, job.name))
    mirror = mirror_root(family(job))
    moved = _moved_from(journal, record)
    pulled: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    refused: list[dict[str, Any]] = []
    for checkpoint in assess(listing):
        if not checkpoint.complete:
            skipped.append({"epoch": checkpoint.epoch, "why": checkpoint.why})
            continue
        root = mirror / str(checkpoint.epoch)
        held = mirror_held(root)
        if moved is not None:
            why = moved_refusal(checkpoint.order, moved["resumed_epoch"], held,
                                mirror_newest(mirror))
            if why is not None:
                refused.append({"epoch": checkpoint.epoch, "step": checkpoint.local_step,
                                "why": why})
                continue
        if held is not None and checkpoint.order <= held:
            if checkpoint.order < held:
                reporter.info(f"• checkpoint {order_text(checkpoint.order)} not mirrored: the "
                              f"mirror holds a newer one ({order_text(held)})")
            continue
        moved_bytes = _pull_checkpoint(stager, session, checkpoint, root, held is not None)
        pulled.append({"epoch": checkpoint.epoch, "step": checkpoint.local_step,
                       "replaced": held is not None, **moved_bytes})
        summary = _summary({"route": "pull", **moved_bytes})
        reporter.info(f"• checkpoint {checkpoint.epoch} ({order_text(checkpoint.order)}"
                      + (f", replacing the mirror's {order_text(held)}" if held is not None
                         else "") + f"): {summary}")
    report = {"host": host_spec, "playbook": job.name, "mirror": str(mirror),
              "pulled": pulled, "not_complete": skipped, "refused": refused,
              "others": listing.get("others") or []}
    for item in skipped:
        reporter.info(f"• checkpoint {item['epoch']} skipped: {item['why']}")
    if refused and moved is not None:
        reporter.warn(refused_message(moved, refused, host_spec))
    if reporter.json_mode:
        reporter.emit_json(report)
    else:
        reporter.success(f"mirror {report['mirror']}: {len(pulled)} new checkpoint(s)")
    return report


def mirror_held(root: Path) -> tuple[int, int, int] | None:
    """Where the checkpoint the mirror holds in ``root`` stands in training (read from its
    training_state.json); None when the folder holds no complete checkpoint (no stage mark:
    absent, or a pull that was cut)."""
    if box_transfer.staged_record(str(root)) is None:
        return None
    return state_order(int(root.name), read_json(root / "training_state.json"))


def mirror_newest(mirror: Path) -> tuple[int, int, int] | None:
    """The newest checkpoint the mirror holds (None when it holds none)."""
    held = [mirror_held(p) for p in mirror.glob("*") if p.name.isdigit()]
    return max((h for h in held if h is not None), default=None)


def moved_refusal(order: tuple[int, int, int], resumed_epoch: int | None,
                  held_here: tuple[int, int, int] | None,
                  newest: tuple[int, int, int] | None) -> str | None:
    """Why a checkpoint of a run that was moved away must not enter the mirror, or None
    (then the mirror's usual rule applies: only a newer state of an epoch replaces it).

    After a move the job's line is the run it moved to, which resumed from checkpoint
    ``resumed_epoch`` (None: it started afresh). What the old run wrote past that epoch is a
    second trainer's work. Below it, the old run may not replace any epoch folder the mirror
    holds (what the successor resumed from, or wrote), nor add one that is not newer than the
    newest the mirror holds. A state the mirror holds already is no refusal: nothing to take."""
    if resumed_epoch is None:
        return "the run it moved to started afresh, so none of this run's checkpoints is its"
    if order[0] > resumed_epoch:
        return (f"written past checkpoint {resumed_epoch}, which the run it moved to resumed "
                "from: a second trainer's work")
    if held_here is not None:
        if order > held_here:
            return (f"it would replace the mirror's {order_text(held_here)}, which the run "
                    "it moved to resumed from or wrote")
        return None
    if newest is not None and order <= newest:
        return f"not newer than the newest the mirror holds ({order_text(newest)})"
    return None


def refused_message(moved: dict[str, Any], refused: list[dict[str, Any]], host_spec: str) -> str:
    """One warning for every checkpoint a moved run was refused: the run, where it went, the
    reason per checkpoint, and the command that stops the old trainer."""
    reasons = "; ".join(f"{order_text(checkpoint_order(r['epoch'], r['step']))}: {r['why']}"
                        for r in refused[:6]) + (f"; and {len(refused) - 6} more"
                                                 if len(refused) > 6 else "")
    return (f"{len(refused)} checkpoint(s) of run {moved['run_id']} not mirrored: it was moved "
            f"to {moved['to_host']} (run {moved['to_run_id']}) at {moved['at']} and the mirror "
            f"follows that run ({reasons}). Stop the old run with `outrig cleanup --host "
            f"{host_spec}`; sync the job's checkpoints from {moved['to_host']}")


def _moved_from(journal: Journal, record: dict[str, Any] | None) -> dict[str, Any] | None:
    """When the synced run was moved away: where to, when, and which checkpoint epoch the run
    it moved to resumed from (None: that run started afresh)."""
    from outrig.journal import utc_text

    moved = (record or {}).get("moved_to")
    if not isinstance(moved, dict):
        return None
    successor = journal.run(str(moved.get("run_id"))) or {}
    resumed = (successor.get("migrated_from") or {}).get("checkpoint")
    epoch = resumed.get("epoch") if isinstance(resumed, dict) else None
    return {"run_id": (record or {}).get("run_id"), "to_host": moved.get("host"),
            "to_run_id": moved.get("run_id"), "at": utc_text(moved.get("at")),
            "resumed_epoch": epoch if isinstance(epoch, int) else None}


def _pull_checkpoint(stager: Stager, session: HostSession, checkpoint: Checkpoint,
                     root: Path, replace: bool) -> dict[str, Any]:
    """Pull one checkpoint folder into the mirror's ``root``. A newer state of an epoch the
    mirror holds goes into a sibling folder first (named for that state, so a cut pull
    resumes there) and is swapped in once whole: the mirror never holds a mix of two saves,
    nor loses the old one to a cut pull. Sibling names are not integers, so a resume from the
    mirror never takes them."""
    import shutil

    label = f"checkpoint {checkpoint.epoch}"
    src_listing = box_manifest(session, [("ckpt", checkpoint.path)], verify=True)["ckpt"]
    if not replace:
        return stager.pull_local(session, checkpoint.path, src_listing, root, label)
    state = "end" if not checkpoint.mid_epoch else f"step{checkpoint.local_step}"
    incoming = root.with_name(f".{root.name}.{state}.incoming")
    for stale in root.parent.glob(f".{root.name}.*.incoming"):
        if stale != incoming:  # a cut pull of another state of this epoch: superseded
            shutil.rmtree(stale, ignore_errors=True)
    moved = stager.pull_local(session, checkpoint.path, src_listing, incoming, label)
    retired = root.with_name(f".{root.name}.replaced-{_secrets.token_hex(4)}")
    root.rename(retired)
    incoming.rename(root)
    shutil.rmtree(retired, ignore_errors=True)
    return moved


def _synced_run(session: HostSession, playbook: str | None,
                run_id: str | None) -> dict[str, Any] | None:
    """The run whose checkpoints are being synced: the host's newest run that really ran (or
    ``run_id``). One ``check`` first: its run index brings the journal in line with the box,
    the truth. With ``playbook`` named, the journal's newest run of it on the host (or
    ``run_id`` among them; None if there is none), without a round trip: only its
    ``moved_to`` mark is needed, which the journal alone knows."""
    if playbook is not None:
        try:
            return pick_host_run(session.journal, session.host.name, run_id=run_id,
                                 playbook=playbook)[0]
        except ConfigError:
            return None
    session.call("check", stream=False)
    run, why = pick_host_run(session.journal, session.host.name, run_id=run_id)
    session.reporter.info(f"• checkpoints of {why}")
    return run
