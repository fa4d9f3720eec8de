"""The flags of vLLM's and torchrun's own parsers that decide how many GPUs a process uses.

Copied from the real parsers, names and aliases exactly, and held to them by a contract test
(tests/realvllm/test_launcher_flags.py builds vLLM's ``make_arg_parser`` and torch's
``torchrun`` parser and compares): vLLM 0.32 ``engine/arg_utils.py`` (the ParallelConfig
group) and ``entrypoints/launchers/cli_args.py`` (``--headless``, ``--config``);
torch ``distributed/run.py`` ``get_args_parser``.
"""

from __future__ import annotations

# vLLM: the sizes whose product is the GPUs one vLLM server uses on one node
# (ParallelConfig.world_size = pipeline × tensor × prefill context parallel; data parallel
# starts that many engines, each with its own world).
VLLM_SIZES: dict[str, tuple[str, ...]] = {
    "tensor_parallel_size": ("--tensor-parallel-size", "-tp"),
    "pipeline_parallel_size": ("--pipeline-parallel-size", "-pp"),
    "prefill_context_parallel_size": ("--prefill-context-parallel-size", "-pcp"),
    "data_parallel_size": ("--data-parallel-size", "-dp"),
}
# vLLM: flags after which the server's GPUs are spread over several nodes, or run in a layout
# whose share on this node the flags alone do not give; the plan says what it did not check.
VLLM_SPANNING: dict[str, tuple[str, ...]] = {
    "nnodes": ("--nnodes", "-n"),
    "node_rank": ("--node-rank", "-r"),
    "data_parallel_size_local": ("--data-parallel-size-local", "-dpl"),
    "data_parallel_rank": ("--data-parallel-rank", "-dpn"),
    "data_parallel_start_rank": ("--data-parallel-start-rank", "-dpr"),
    "data_parallel_address": ("--data-parallel-address", "-dpa"),
    "headless": ("--headless",),
}
VLLM_BOOLEAN = frozenset({"--headless"})
# vLLM reads more flags from this YAML file; outrig cannot see into it from the workstation
VLLM_CONFIG = "--config"
# How each size is named in a message (the short name people know from vLLM's docs)
SIZE_WORDS = {"tensor_parallel_size": "tensor", "pipeline_parallel_size": "pipeline",
              "prefill_context_parallel_size": "prefill context",
              "data_parallel_size": "data"}

# The Python modules that start vLLM's OpenAI server: (module, subcommand it needs or "")
VLLM_MODULES: dict[str, str] = {
    "vllm.entrypoints.openai.api_server": "",
    "vllm.entrypoints.cli.main": "serve",
}
TORCHRUN_MODULES = ("torch.distributed.run",)

# torchrun: the launcher's flags end at the training script (or -m's module): these take no
# value, every other flag of its parser takes one.
TORCHRUN_NPROC = ("--nproc-per-node", "--nproc_per_node")
TORCHRUN_NNODES = ("--nnodes",)
TORCHRUN_BOOLEAN = frozenset({"--standalone", "-m", "--module", "--no-python", "--no_python",
                              "--run-path", "--run_path", "--virtual-local-rank",
                              "--virtual_local_rank", "-h", "--help"})
# torchrun takes a flag's default from PET_<DEST> in its environment (torch's ``env`` action)
TORCHRUN_ENV = {"nproc_per_node": "PET_NPROC_PER_NODE", "nnodes": "PET_NNODES"}
# --nproc-per-node words meaning one rank per visible GPU (torch's determine_local_world_size)
TORCHRUN_PER_GPU = frozenset({"gpu", "auto"})

# Programs that run a shell script or a command string: nothing inside them can be read
SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh"})
# Wrappers that run the rest of the command line unchanged
WRAPPERS = frozenset({"nohup", "exec", "time", "stdbuf"})
