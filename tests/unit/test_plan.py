"""The planner rejects, before anything is sent, every placement the hand-run scripts got wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from outrig.inventory import Host
from outrig.plan import HostFacts, Plan, make_plan
from outrig.playbook import load_job

HOST = Host(name="box", hostname="127.0.0.1", workdir="/workspace/dflash")


def plan_for(tmp_path: Path, text: str, facts: HostFacts | None = None) -> Plan:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return make_plan(load_job(path), HOST, facts or HostFacts(gpu_count=4), "run-1")


def test_renders_argv_env_and_order(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, """
params: {port: 8000}
processes:
  trainer:
    after: server
    command: torchrun --nproc_per_node 2 train.py --endpoint http://127.0.0.1:${port}/v1
    gpus: [2, 3]
  server:
    command: [vllm, serve, m, -tp, "2", --port, "${port}"]
    gpus: [0, 1]
    parallel: {tensor: 2, data: 1}
    ready: {http: "http://127.0.0.1:${port}/health", timeout: 600}
""")
    assert plan.ok, plan.problems
    assert plan.order == ["server", "trainer"]
    server = plan.processes["server"]
    assert server.argv == ["vllm", "serve", "m", "-tp", "2", "--port", "8000"]
    assert server.env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert server.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert server.ready is not None and server.ready.http == "http://127.0.0.1:8000/health"
    assert plan.processes["trainer"].argv[-1] == "http://127.0.0.1:8000/v1"
    assert plan.processes["trainer"].env["CUDA_VISIBLE_DEVICES"] == "2,3"


def test_cpu_process_gets_no_visible_gpu(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, "processes:\n  a:\n    command: echo\n")
    assert plan.processes["a"].env["CUDA_VISIBLE_DEVICES"] == ""


def test_gpu_shared_by_two_processes_is_rejected(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, """
processes:
  a: {command: echo, gpus: [0, 1]}
  b: {command: echo, gpus: [1, 2]}
""")
    assert any("GPU 1 is given to both a and b" in p for p in plan.problems)
    assert any("job.yaml:4: processes.b.gpus" in p for p in plan.problems)


def test_gpu_index_beyond_host_is_rejected(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, "processes:\n  a: {command: echo, gpus: [1, 2]}\n",
                    HostFacts(gpu_count=2, source="test"))
    assert any("GPU 2 does not exist on box, which has 2 GPU(s) (0-1" in p for p in plan.problems)


def test_unknown_gpu_count_defers_the_check_to_the_box(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, "processes:\n  a: {command: echo, gpus: [7]}\n", HostFacts())
    assert plan.ok
    assert any("checks the GPU indices on the box" in note for note in plan.notes)


def test_tp_times_dp_must_equal_gpu_count(tmp_path: Path) -> None:
    # The exact hand-made failure: TP=2 × DP=2 on 2 GPUs.
    plan = plan_for(tmp_path, """
processes:
  server:
    command: vllm serve m -tp 2 -dp 2
    gpus: [0, 1]
    parallel: {tensor: 2, data: 2}
""")
    assert len(plan.problems) == 1
    problem = plan.problems[0]
    assert "tensor 2 × data 2 = 4 GPUs, but server has 2 GPU(s) [0, 1]" in problem
    assert "DP adjusted local rank" in problem and "Give it 4 GPUs" in problem


def test_after_cycle_is_rejected(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, """
processes:
  a: {command: echo, after: c}
  b: {command: echo, after: a}
  c: {command: echo, after: b}
""")
    assert any("'after' forms a cycle (a → c → b → a)" in p for p in plan.problems)


def test_after_unknown_name_is_rejected(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, "processes:\n  a: {command: echo, after: srv}\n")
    assert any("unknown process 'srv'; processes are: a" in p for p in plan.problems)


def test_undefined_template_name_is_a_plan_error_with_line(tmp_path: Path) -> None:
    # The VLLM_DP bug class: a name used before anything defined it.
    plan = plan_for(tmp_path, """
params: {tp: 1}
processes:
  server:
    command: vllm serve m --data-parallel-size ${VLLM_DP} --tensor-parallel-size ${tp}
""")
    assert len(plan.problems) == 1
    assert "job.yaml:5: processes.server.command: ${VLLM_DP} is not defined" in plan.problems[0]


def test_builtin_names_are_available_and_not_redefinable(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, """
params: {run_id: mine}
processes:
  a: {command: "echo ${run_dir} ${workdir} ${playbook} ${host}"}
""")
    assert plan.processes["a"].argv[1:] == ["/workspace/dflash/runs/run-1", "/workspace/dflash",
                                            "job", "box"]
    assert any("'run_id' is a built-in name" in p for p in plan.problems)


def test_shell_metacharacters_stay_one_argument(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, """
params: {evil: "x; touch /tmp/pwned && echo $(id)"}
processes:
  a: {command: "echo --name ${evil}"}
""")
    assert plan.processes["a"].argv == ["echo", "--name", "x; touch /tmp/pwned && echo $(id)"]


def test_reserved_env_names_are_rejected(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, "processes:\n  a:\n    command: echo\n"
                              "    env: {CUDA_VISIBLE_DEVICES: '0'}\n")
    assert any("CUDA_VISIBLE_DEVICES is set by outrig from gpus:" in p for p in plan.problems)


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, """
processes:
  a: {command: "echo ${nope}", gpus: [0], after: b}
  b: {command: echo, gpus: [0], after: a}
""")
    kinds = " | ".join(plan.problems)
    assert "not defined" in kinds and "given to both" in kinds and "cycle" in kinds


def test_plan_to_dict_is_json_serialisable(tmp_path: Path) -> None:
    import json

    plan = plan_for(tmp_path, "processes:\n  a: {command: echo, ready: {port: 80}}\n")
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["processes"][0]["name"] == "a"
    assert data["processes"][0]["ready"]["port"] == 80


@pytest.mark.parametrize("port", ["0", "70000", "abc"])
def test_bad_ready_port_is_rejected(tmp_path: Path, port: str) -> None:
    plan = plan_for(tmp_path, f"processes:\n  a: {{command: echo, ready: {{port: '{port}'}}}}\n")
    assert any("is not a TCP port" in p for p in plan.problems)


def test_cwd_leaving_the_workdir_is_a_plan_problem(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, """
processes:
  a: {command: "true", cwd: ../../etc}
  b: {command: "true", cwd: sub/../../x}
  c: {command: "true", cwd: sub/../ok}
""")
    assert not plan.ok
    assert len(plan.problems) == 2, plan.problems
    assert all("leaves the workdir" in p for p in plan.problems)
    assert "processes.a.cwd" in plan.problems[0] and "'../../etc'" in plan.problems[0]


def test_templated_ready_url_without_scheme_is_a_plan_problem(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, """
params: {url: "127.0.0.1:8000/health"}
processes:
  a: {command: "true", ready: {http: "${url}"}}
""")
    assert not plan.ok
    assert any("processes.a.ready.http" in p and "has no scheme" in p for p in plan.problems)
