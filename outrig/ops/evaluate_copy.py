"""A checkpoint copied to the second box of ``evaluate.during_training.host`` (docs/evaluate.md
"During training").

The copy lands in ``<workdir>/evaluations/<playbook>/<epoch>/`` there: a numbered folder, so
the evaluation judges it by the same completeness rule as the training box (every file of
the set, training_state.json written last; the copy keeps each file's mtime), and records
the epoch and steps its own training_state.json names. One folder per epoch, copied by
difference like a stage (only the files that changed since the last copy move), straight
from box to box where the second box can reach the first over ssh, else relayed through the
workstation (:class:`outrig.ops.stage.Stager`, the route a move takes).
"""

from __future__ import annotations

from outrig.checkpoints import Checkpoint
from outrig.errors import RemoteError
from outrig.journal import Journal, safe_name
from outrig.ops.stage import Stager, box_manifest
from outrig.session import HostSession

COPIES = "evaluations"  # under the second box's workdir


def copy_folder(dest: HostSession, playbook: str, epoch: int) -> str:
    """Where the checkpoint of ``epoch`` is copied on the second box."""
    return f"{dest.host.workdir.rstrip('/')}/{COPIES}/{safe_name(playbook)}/{epoch}"


def copy_checkpoint(src: HostSession, dest: HostSession, ckpt: Checkpoint, playbook: str,
                    journal: Journal) -> str:
    """Copy ``ckpt`` from the training box ``src`` to ``dest``; the folder there."""
    target = copy_folder(dest, playbook, ckpt.epoch)
    stager = Stager(dest.reporter, journal)
    src_listing = box_manifest(src, [("ckpt", ckpt.path)], verify=True)["ckpt"]
    dest_listing = box_manifest(dest, [("ckpt", target)])["ckpt"]
    label, name = f"{src.host.name}:{ckpt.path}", f"checkpoint {ckpt.epoch}"
    try:
        stager.peer(src, ckpt.path, src_listing, dest, target, dest_listing, name, label)
    except RemoteError as exc:
        dest.reporter.warn(f"checkpoint: direct copy failed ({exc}); relaying")
        stager.relay(src, ckpt.path, src_listing, dest, target, dest_listing, name, label)
    return target
