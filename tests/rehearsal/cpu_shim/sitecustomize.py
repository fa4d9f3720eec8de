"""CPU shim for the speculators 0.9.0 trainer: test-only, loaded through ``PYTHONPATH``.

The CPU rehearsal (tests/rehearsal/README.md) runs the real ``torchrun -m speculators.train``
on a machine with no accelerator. speculators assumes one in a few places; on torch 2.13
CPU each of them raises ``RuntimeError: Cannot access accelerator device when none is
available`` or picks ``cuda``. Python imports ``sitecustomize`` at start-up from
``PYTHONPATH``, so putting this folder there (the playbook's ``trainer.env.PYTHONPATH``)
patches every trainer process, its spawned DataLoader workers included, and nothing else.

Nothing is patched until the speculators module concerned is imported, and none of the CUDA
patches when ``torch.accelerator.is_available()`` is true: on a GPU box only the rehearsal knob
below (off unless set) can act.

speculators 0.9.0 file:line     assumption => patch
------------------------------  -------------------------------------------------------------------
train/distributed.py:151-156    set_device_index(local_rank), ValueError('No accelerator found'),
maybe_setup_distributed         backend from the accelerator (NCCL),
                                init_process_group(device_id=local_rank) => same function with gloo
                                and no device id; same module state and process groups
train/trainer.py:221, used at   self.local_rank = get_local_rank(); .to(self.local_rank) treats the
:348, :383, :533, :643          int as a CUDA index => the trainer module's get_local_rank returns
                                torch.device('cpu') (distributed.py's own getter is untouched, so
                                logged ranks stay ints)
train/trainer.py:227-228, used  device_type = acc.type if acc else 'cuda'; torch.autocast('cuda')
at :539, :649                   is disabled with a warning on CPU => Trainer.device_type = 'cpu'
                                after __init__
train/trainer.py:80, :92        torch.accelerator.synchronize() raises without an accelerator => a
(_StepTimer, every --log-freq   no-op while torch.accelerator.is_available() is false
step)
utils/util.py:15-17, used by    get_current_device() returns 'cuda:0' without an accelerator =>
train/checkpointer.py:306,      returns 'cpu' (in utils.util and in train.checkpointer, which
:323 on resume                  imported it by name at :23)

Rehearsal knobs (not patches of a CUDA assumption; each acts with or without an accelerator,
and only when a test sets it):

* ``REHEARSAL_SAVE_DELAY_S=<seconds>`` makes every checkpoint save pause between
  ``model.safetensors`` and ``optimizer_state_dict.pt``, so a test can stop the trainer while
  a save is in progress, as happens on a GPU box where the draft checkpoint takes seconds to
  write (the GPU rehearsal uses it too: the tiny draft saves in milliseconds there as well).
* ``REHEARSAL_HOLD_AFTER_SAVE=1`` makes each rank wait, after its first complete mid-epoch
  save (``training_state.json`` and the ``epoch<E>_step<K>`` link written: the real
  ``Trainer.maybe_save_checkpoint`` has returned), until it is signalled, instead of training
  on. On a GPU box the next save is many minutes of steps away; here it is a few seconds, so
  a stop that comes "some time after a save" can land in the next save's in-place rewrite of
  the same folder on a loaded machine. With the hold the newest complete checkpoint at the
  stop is always the one the test saw. The wait is ``time.sleep``, which a signal interrupts:
  speculators' own SIGTERM handler raises out of it as out of any step, and the rank saves
  ``interrupted/`` and exits as it would mid-step.

Also needed on CPU, as trainer flags rather than patches: ``--loss-implementation eager``
(the default ``fused`` loss is a Triton kernel, losses/fused.py) and ``--draft-attn-impl
sdpa`` (the default ``simple_flex_attention`` compiles flex attention).

Standard library only at import time; torch is touched only once speculators has imported it.
"""

from __future__ import annotations

import os
import sys
import time
from types import ModuleType
from typing import Any, Callable, Dict

_NOTICE = "cpu_shim: "
# Rehearsal knob, not a CUDA patch: a real draft checkpoint takes seconds to write, the tiny
# CPU one about 0.1 s. Setting this stretches every save (after model.safetensors and
# config.json, before optimizer_state_dict.pt: train/checkpointer.py:350-359) so a test can
# stop the trainer *during* a save.
SAVE_DELAY_ENV = "REHEARSAL_SAVE_DELAY_S"
# Rehearsal knob: after its first complete mid-epoch save the rank waits to be stopped.
HOLD_ENV = "REHEARSAL_HOLD_AFTER_SAVE"


def _no_accelerator() -> bool:
    import torch

    return not torch.accelerator.is_available()


def _say(text: str) -> None:
    if os.environ.get("LOCAL_RANK", "0") == "0" and not _in_worker():
        print(_NOTICE + text, file=sys.stderr, flush=True)


def _in_worker() -> bool:
    """DataLoader workers are spawned children; they get the patches but say nothing."""
    import multiprocessing

    return multiprocessing.current_process().name != "MainProcess"


def _patch_distributed(mod: ModuleType) -> None:
    import torch
    import torch.distributed as dist

    def maybe_setup_distributed(sp_size: int = 1) -> None:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        mod._local_rank = local_rank
        mod._is_distributed = "LOCAL_RANK" in os.environ
        if not mod._is_distributed:
            return
        dist.init_process_group("gloo")
        mod._rank = dist.get_rank()
        mod._world_size = dist.get_world_size()
        mod._init_sp_process_groups(mod._rank, mod._world_size, sp_size)
        mod.logger.info(
            f"Started distributed with local_rank={local_rank}, "
            f"dp_size={mod._dp_size}, sp_size={mod._sp_size}",
            extra={"override_rank0_filter": True})

    mod.maybe_setup_distributed = maybe_setup_distributed
    if not getattr(torch.accelerator.synchronize, "_cpu_shim", False):
        real_sync: Callable[..., Any] = torch.accelerator.synchronize

        def synchronize(*args: Any, **kwargs: Any) -> None:
            if torch.accelerator.is_available():
                real_sync(*args, **kwargs)

        synchronize._cpu_shim = True  # type: ignore[attr-defined]
        torch.accelerator.synchronize = synchronize
    _say("train/distributed.py:151-156 -> gloo, no device index; "
         "torch.accelerator.synchronize -> no-op")


def _patch_trainer(mod: ModuleType) -> None:
    import torch

    if os.environ.get(HOLD_ENV) == "1":
        _hold_after_save(mod.Trainer)
    if not _no_accelerator():
        return
    mod.get_local_rank = lambda: torch.device("cpu")
    trainer_cls = mod.Trainer
    real_init = trainer_cls.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        real_init(self, *args, **kwargs)
        self.device_type = "cpu"

    trainer_cls.__init__ = __init__
    _say("train/trainer.py:221,228 -> .to(cpu), autocast('cpu')")


def _hold_after_save(trainer_cls: Any) -> None:
    """The ``REHEARSAL_HOLD_AFTER_SAVE`` knob (module docstring): the real save runs whole,
    then the rank sleeps until a signal's handler raises out of the sleep. Only a mid-epoch
    save of an epoch (``local_step`` > 0, the call at train/trainer.py:614) holds; the end-of-epoch
    and ``interrupted`` saves return as they are."""
    real_save = trainer_cls.maybe_save_checkpoint

    def maybe_save_checkpoint(self: Any, epoch: Any, local_step: int = 0) -> None:
        real_save(self, epoch, local_step=local_step)
        if not isinstance(epoch, int) or local_step <= 0:
            return
        _say(f"{HOLD_ENV}: holding after the save of epoch {epoch} step {local_step} "
             "until stopped")
        while True:
            time.sleep(1)

    trainer_cls.maybe_save_checkpoint = maybe_save_checkpoint
    _say(f"{HOLD_ENV}=1: the first mid-epoch save is the last; the rank then waits for its "
         "stop")


def _patch_util(mod: ModuleType) -> None:
    mod.get_current_device = lambda: "cpu"
    _say("utils/util.py:17 'cuda:0' -> 'cpu'")


def _patch_checkpointer(mod: ModuleType) -> None:
    if _no_accelerator():
        mod.get_current_device = lambda: "cpu"
    delay = float(os.environ.get(SAVE_DELAY_ENV) or 0)
    if delay > 0:
        real_patch_config = mod.patch_config_dtype

        def patch_config_dtype(*args: Any, **kwargs: Any) -> None:
            real_patch_config(*args, **kwargs)
            time.sleep(delay)

        mod.patch_config_dtype = patch_config_dtype
        _say(f"{SAVE_DELAY_ENV}={delay:g}: every checkpoint save pauses {delay:g}s between "
             "model.safetensors and optimizer_state_dict.pt")


# Applied on a GPU box too: the checkpointer patch holds the save-delay knob, the trainer
# patch the hold knob (the CUDA part of each checks for an accelerator itself).
ALWAYS = (_patch_checkpointer, _patch_trainer)

PATCHES: Dict[str, Callable[[ModuleType], None]] = {
    "speculators.train.distributed": _patch_distributed,
    "speculators.train.trainer": _patch_trainer,
    "speculators.utils.util": _patch_util,
    "speculators.train.checkpointer": _patch_checkpointer,
}


def _load_patching() -> ModuleType:
    """tests/rehearsal/patching.py, from its path: only this folder is on PYTHONPATH."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "patching.py")
    spec = importlib.util.spec_from_file_location("_rehearsal_patching", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_load_patching().install(PATCHES, when=lambda patch: _no_accelerator() or patch in ALWAYS)
