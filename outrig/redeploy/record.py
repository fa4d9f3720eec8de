"""The move record: what a deploy keeps in its run's journal record so that the run can be
deployed again exactly, with nothing but the journal and a spare (pure: no I/O).

Kept under the run record's ``deployed`` key:

* ``playbook``: the playbook file's text as it was read for the deploy (``text``), where it
  was (``file``, absolute), the folder its ``files:`` are found from (``base_dir``) and a
  digest of the text (``sha256``), so a later redeploy uses the job as it was deployed and
  can say when the file changed since;
* ``params`` (the ``--param`` overrides) and ``test`` (``--test``);
* ``host``: the box's address as the deploy reached it: hostname, port, user, identity file
  (its path, never the key), known_hosts, workdir, interpreter, the host file's ``env`` and
  where the host was defined. A box whose host file was deleted (a dead rented box often is,
  ``outrig sandbox-down`` does it) is still reachable, or at least probeable, at it.

Never a secret: the playbook's ``secrets:`` values are read from the shell at each deploy and
not written here; a host ``env`` entry named like one of them is left out too.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from outrig.errors import ConfigError
from outrig.inventory import Host
from outrig.journal import Journal

if TYPE_CHECKING:  # the playbook models (pydantic, the recipes) only where a job is loaded
    from outrig.playbook import Job

RECORD_KEY = "deployed"
_HOST_TEXT = ("hostname", "workdir", "user", "identity_file", "known_hosts", "python",
              "node_address", "source")


def text_digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def move_record(job: Job, host: Host, params: dict[str, Any] | None) -> dict[str, Any]:
    """The ``deployed`` value of a run record for ``job`` deployed on ``host``."""
    source = job.doc.source
    secrets = set(job.spec.secrets)
    return {
        "playbook": {"name": job.name, "text": job.doc.text, "sha256": text_digest(job.doc.text),
                     "file": str(source) if source is not None else str(job.doc.path),
                     "base_dir": str(base_dir_of(job))},
        "params": dict(params or {}),
        "test": bool(job.test_mode),
        "host": host_fields(host, secrets),
    }


def base_dir_of(job: Job) -> Path:
    """Where the playbook's relative ``files:`` were found (what :func:`~outrig.playbook.
    load_job` takes by default: the project root above ``playbooks/``, else the file's
    folder)."""
    path = job.doc.source or Path(job.doc.path)
    return path.parent.parent if path.parent.name == "playbooks" else path.parent


def host_fields(host: Host, secrets: set[str] | None = None) -> dict[str, Any]:
    """Everything a connection to ``host`` needs, as JSON (no secret: see the module)."""
    fields: dict[str, Any] = {key: getattr(host, key) for key in _HOST_TEXT}
    fields.update({"name": host.name, "port": host.port, "gpus": host.gpus,
                   "connect_timeout": host.connect_timeout, "keep_seconds": host.keep_seconds,
                   "is_local": host.is_local,
                   "env": {k: v for k, v in host.env.items() if k not in (secrets or set())}})
    return fields


def recorded_host(record: dict[str, Any] | None) -> Host | None:
    """The host a run record's move record names (None without one: a run deployed by an
    older outrig, or a record that was damaged)."""
    fields = ((record or {}).get(RECORD_KEY) or {}).get("host")
    if not isinstance(fields, dict) or not isinstance(fields.get("hostname"), str) \
            or not isinstance(fields.get("workdir"), str) or not fields.get("name"):
        return None
    env = fields.get("env")
    gpus = fields.get("gpus")
    port = fields.get("port")
    return Host(name=str(fields["name"]), hostname=fields["hostname"],
                workdir=fields["workdir"], port=port if isinstance(port, int) else None,
                user=_text(fields.get("user")), identity_file=_text(fields.get("identity_file")),
                known_hosts=_text(fields.get("known_hosts")),
                env={str(k): str(v) for k, v in env.items()} if isinstance(env, dict) else {},
                python=_text(fields.get("python")) or "python3",
                gpus=gpus if isinstance(gpus, int) else "auto",
                connect_timeout=_number(fields.get("connect_timeout")),
                keep_seconds=_number(fields.get("keep_seconds")),
                source=f"the journal's record of {fields['name']} "
                       f"(was {_text(fields.get('source')) or 'a host file'})",
                is_local=bool(fields.get("is_local")),
                node_address=_text(fields.get("node_address")))


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None


def run_host(book: Callable[[str], Host], journal: Journal, name: str,
             run_id: str | None = None) -> tuple[Host, str | None]:
    """The box named ``name`` (a run's host, as the journal files it): its host file (or
    alias, or address) when it still resolves, else the address the move record of
    ``run_id`` (or of the host's newest run that has one) holds, with a note saying so.
    A ConfigError when neither exists. ``book`` resolves a host spec
    (:class:`~outrig.inventory.HostBook`, the command's or one of the caller's own)."""
    try:
        return book(name), None
    except ConfigError as missing:
        records = [journal.run(run_id)] if run_id else []
        records += journal.runs(host=name)
        for record in records:
            host = recorded_host(record)
            if host is not None and host.name == name:
                return host, (f"{name} has no host file any more: using the address recorded "
                              f"with run {record.get('run_id') if record else '?'} "
                              f"({host.describe()}, workdir {host.workdir})")
        raise missing from None
