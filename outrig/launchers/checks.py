"""The GPU count a pasted vLLM or torchrun command asks for, checked against the process's
``gpus:`` as the planner checks a recipe's ``parallel:``. Pure: a :class:`Launch` and the
process's settings in, the messages out (the planner puts the file and key in front).

vLLM started with more ranks than visible GPUs dies minutes in (``DP adjusted local rank 3
is out of bounds``, or CUDA's ``invalid device ordinal``); started with fewer, it leaves
GPUs that the run holds idle. torchrun with more ranks than GPUs fails the same way in the
ranks' ``torch.cuda.set_device``, and a ``--nnodes`` larger than the job's nodes waits at the
rendezvous for nodes that never come.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod

from outrig.launchers.flags import SIZE_WORDS, TORCHRUN_PER_GPU, VLLM_SIZES, VLLM_SPANNING
from outrig.launchers.reading import Launch


@dataclass
class Findings:
    """Problems (the plan fails) and notes (said, not failed), each without its key path."""

    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def check_launch(launch: Launch, name: str, gpus: list[int],
                 parallel: tuple[int, int] | None, nodes: int,
                 nnodes_literal: bool = True) -> Findings:
    """``parallel``: the process's declared (tensor, data), which the planner checks against
    ``gpus`` itself; ``nodes``: the job's node count; ``nnodes_literal``: torchrun's
    ``--nnodes`` was written as a number, not ``${nnodes}``."""
    out = Findings()
    if launch.program == "shell" and gpus:
        out.notes.append(
            f"{launch.shell}: outrig cannot read the flags of what it launches, so nothing was "
            f"checked against the {len(gpus)} GPU(s) {gpus} of {name}")
    elif launch.program == "vllm":
        _check_vllm(launch, name, gpus, parallel, out)
    elif launch.program == "torchrun":
        _check_torchrun(launch, name, gpus, nodes, nnodes_literal, out)
    return out


def _whole(launch: Launch, dest: str, out: Findings, what: str) -> int | None:
    text = launch.flags.get(dest)
    if text is None:
        return 1
    if "${" in text:
        return None  # a name nobody defined: the planner has said so
    try:
        value = int(text)
        if value < 1:
            raise ValueError
    except ValueError:
        out.problems.append(f"{what}'s {launch.spelled[dest]} {text!r} is not a whole number "
                            "of 1 or more; its parser would refuse it")
        return None
    return value


def _check_vllm(launch: Launch, name: str, gpus: list[int],
                parallel: tuple[int, int] | None, out: Findings) -> None:
    sizes = {dest: _whole(launch, dest, out, "vLLM") for dest in VLLM_SIZES}
    if any(v is None for v in sizes.values()):
        return
    values = {dest: int(v or 1) for dest, v in sizes.items()}
    spanning = [launch.spelled[d] for d in VLLM_SPANNING if d in launch.flags
                and not (d == "nnodes" and launch.flags[d] == "1")]
    if spanning or launch.unread:
        why = (f"{', '.join(spanning)} spreads vLLM over nodes" if spanning
               else launch.unread)
        out.notes.append(f"{why}; outrig did not check vLLM's parallel sizes against the "
                         f"{len(gpus)} GPU(s) of {name}")
        return
    if parallel is not None:
        declared = {"tensor_parallel_size": parallel[0], "data_parallel_size": parallel[1]}
        for dest, want in declared.items():
            if values[dest] != want:
                have = (f"{launch.spelled[dest]} {values[dest]}" if dest in launch.spelled
                        else f"no {VLLM_SIZES[dest][0]} (so {values[dest]})")
                out.problems.append(
                    f"parallel: says {SIZE_WORDS[dest]} {want}, but the command has {have}; "
                    "vLLM runs what the command says. Make the two agree")
        if any(values[d] != w for d, w in declared.items()):
            return
        if values["pipeline_parallel_size"] * values["prefill_context_parallel_size"] == 1:
            return  # the planner's parallel: check covers tensor × data
    if not gpus:
        return  # no GPUs given: a CPU build, or outrig hides every GPU from it
    total = prod(values.values())
    if total == len(gpus):
        return
    given = [f"{launch.spelled[d]} {values[d]}" for d in VLLM_SIZES if d in launch.spelled]
    uses = (f"vLLM's {' × '.join(given)} = {total} GPU(s)" if given
            else "vLLM without parallel flags uses 1 GPU")
    outcome = ("vLLM would die minutes in with 'DP adjusted local rank N is out of bounds' "
               "or 'invalid device ordinal'" if total > len(gpus)
               else f"{len(gpus) - total} of them would sit idle, held by the run")
    out.problems.append(
        f"{uses}, but {name} has {len(gpus)} GPU(s) {gpus}; "
        f"{outcome}. Give it {total} GPU(s) in gpus:, or change the flags so that "
        f"tensor × pipeline × data = {len(gpus)}")


def _check_torchrun(launch: Launch, name: str, gpus: list[int], nodes: int,
                    nnodes_literal: bool, out: Findings) -> None:
    nproc = launch.flags.get("nproc_per_node")
    if nproc is not None and gpus and nproc not in TORCHRUN_PER_GPU:
        flag = launch.spelled["nproc_per_node"]
        try:
            ranks = int(nproc)
        except ValueError:
            out.notes.append(f"torchrun's {flag} {nproc!r} is not a rank count outrig can "
                             f"read; nothing was checked against the {len(gpus)} GPU(s) of "
                             f"{name}")
            ranks = len(gpus)
        if ranks != len(gpus):
            outcome = ("the ranks past the last GPU would fail in torch.cuda.set_device "
                       "('invalid device ordinal')" if ranks > len(gpus)
                       else f"{len(gpus) - ranks} GPU(s) would sit idle, held by the run")
            out.problems.append(
                f"torchrun's {flag} {ranks} starts {ranks} rank(s), but {name} has "
                f"{len(gpus)} GPU(s) {gpus}; {outcome}. Give it {ranks} GPU(s) in gpus:, or "
                f"set {flag} {len(gpus)} (one rank per GPU)")
    nnodes = launch.flags.get("nnodes")
    if nnodes is None or not nnodes_literal:
        return
    low = nnodes.partition(":")[0]
    if low.isdigit() and int(low) > nodes:
        flag = launch.spelled["nnodes"]
        out.problems.append(
            f"torchrun's {flag} {nnodes} waits for {low} node(s), but the playbook has nodes: "
            f"{nodes}; the rendezvous would wait for nodes that never come. Set nodes: {low}, "
            f"or write {flag} ${{nnodes}} (outrig fills in each node's count)")
