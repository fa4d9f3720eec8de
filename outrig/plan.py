"""The planner: Job × host facts → :class:`Plan`. Pure: no network, no files, no clock.

Everything that can be known before contacting the box is decided and checked here, so a bad
playbook fails in milliseconds on the workstation instead of minutes later on the box:
GPU overlap, GPU indices the host lacks, tensor × data parallel ≠ GPU count (the
``DP adjusted local rank 3 is out of bounds`` crash; from ``parallel:`` or read from a pasted
vLLM or torchrun command, :mod:`outrig.launchers`), ``after`` cycles and unknown names, and
``${names}`` nobody defined. ``inv plan`` prints the result; deploy sends it.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from pydantic import ValidationError

from outrig import recipes
from outrig.agent_code import LAUNCH_ENV_KEYS
from outrig.formats.template import UndefinedName, substitute
from outrig.formats.yamlfile import validation_messages
from outrig.inventory import Host
from outrig.launchers import check_launch, read_launch
from outrig.playbook import Job, ProcessSpec
from outrig.recipes import EnvFacts, ModelFacts, RecipeContext
from outrig.text.layout import ranges


@dataclass(frozen=True)
class HostFacts:
    """What is known about the box when planning (declared, or cached from the last contact)."""

    gpu_count: int | None = None
    gpu_memory_mib: int | None = None
    source: str = "unknown"
    # model (path or hub id) → facts read on the box or cached; only recipes look at these
    models: dict[str, ModelFacts] = field(default_factory=dict)
    # interpreter path on the box → its packages (read by deploy; unknown to a bare `inv plan`)
    envs: dict[str, EnvFacts] = field(default_factory=dict)


@dataclass(frozen=True)
class NodePlace:
    """Where one node's plan sits in a multi-node job: its rank, the node count, how the
    others reach node 0 (``head_host``) and the id shared by the nodes (``job_id``; each
    node's own run id is that plus ``-node<rank>``)."""

    rank: int
    nnodes: int
    head_host: str
    job_id: str
    # every node's address as the others reach it (node 0's is head_host), and whether node
    # 0's was declared with node_address: (a loopback address then means one machine)
    hosts: tuple[str, ...] = ()
    head_declared: bool = False


@dataclass
class ReadyPlan:
    http: str | None = None
    log: str | None = None
    port: int | None = None
    exit: bool = False
    timeout: float = 120.0
    model: str | None = None
    generate: bool = False

    def describe(self) -> str:
        parts = []
        if self.http:
            parts.append(f"GET {self.http}")
        if self.model:
            parts.append(f"/v1/models serves {self.model}")
        if self.generate:
            parts.append("answers POST /v1/completions")
        if self.port is not None:
            parts.append(f"port {self.port}")
        if self.log:
            parts.append(f"log /{self.log}/")
        if self.exit:
            parts.append("exit 0")
        return " + ".join(parts) + f" (≤{self.timeout:g}s)" if parts else "on launch"


@dataclass
class ProcessPlan:
    name: str
    argv: list[str]
    env: dict[str, str]
    cwd: str | None
    gpus: list[int]
    after: list[str]
    ready: ReadyPlan | None
    fatal: list[str]
    stop_grace: float
    parallel: tuple[int, int] | None = None
    stop_children_first: bool = False
    checkpoints: dict[str, Any] | None = None
    scratch: list[str] = field(default_factory=list)


@dataclass
class Plan:
    """The whole decision, printable with ``inv plan`` and sendable as an agent request."""

    host: str
    playbook: str
    run_id: str
    workdir: str
    test_mode: bool
    facts: HostFacts
    order: list[str] = field(default_factory=list)
    processes: dict[str, ProcessPlan] = field(default_factory=dict)
    files: list[tuple[str, str]] = field(default_factory=list)  # (remote, local)
    secrets: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    node_rank: int = 0
    nnodes: int = 1
    job_id: str = ""  # shared by the nodes of a multi-node job (the run id for one node)
    launch_with_head: bool = False  # started with node 0, not after it (a spanning server)
    node_group: str = ""  # nodes of one group must have the same GPU count

    @property
    def ok(self) -> bool:
        return not self.problems

    def max_gpu_index(self) -> int | None:
        indices = [g for p in self.processes.values() for g in p.gpus]
        return max(indices) if indices else None

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (``inv plan --json``, the journal, the run manifest)."""
        data = asdict(self)
        data["processes"] = [asdict(self.processes[name]) for name in self.order] + [
            asdict(p) for n, p in self.processes.items() if n not in self.order
        ]
        return data


def single_node(host: Host, run_id: str) -> NodePlace:
    """A one-node job: rank 0 of 1, its own box the head, the run id the job id."""
    return NodePlace(rank=0, nnodes=1, head_host=host.peer_address(), job_id=run_id,
                     hosts=(host.peer_address(),), head_declared=host.node_address is not None)


def builtin_params(host: Host, job: Job, run_id: str,
                   node: NodePlace | None = None) -> dict[str, object]:
    """Names every playbook may use without defining them. The node names (``node_rank``,
    ``nnodes``, ``head_host``, ``rdzv_port``, ``job_id``, ``is_head``) are what a multi-node
    launcher needs (``torchrun --nnodes ${nnodes} --node-rank ${node_rank} --rdzv-endpoint
    ${head_host}:${rdzv_port} --rdzv-id ${job_id} --rdzv-conf is_host=${is_head}``); a
    one-node job gets rank 0 of 1. ``node_host`` is this node's own address and
    ``node_host_<i>`` node i's, as the other nodes reach them (a layout whose trainer starts on
    a later node rendezvouses there; a plan shown alone names the others ``node<i>``)."""
    workdir = host.workdir.rstrip("/")
    node = node or single_node(host, run_id)
    count = max(job.spec.nodes, node.nnodes)
    hosts = {f"node_host_{i}": node.hosts[i] if i < len(node.hosts) else f"node{i}"
             for i in range(count)}
    return {**hosts,
        "node_host": hosts.get(f"node_host_{node.rank}", host.peer_address()),
        "run_id": run_id,
        "workdir": workdir,
        "run_dir": f"{workdir}/runs/{run_id}",
        "playbook": job.name,
        "host": host.name,
        "node_rank": node.rank,
        "nnodes": node.nnodes,
        "head_host": node.head_host,
        "rdzv_port": job.spec.rdzv_port,
        "job_id": node.job_id,
        "is_head": node.rank == 0,
    }


def make_plan(job: Job, host: Host, facts: HostFacts, run_id: str,
              node: NodePlace | None = None) -> Plan:
    """Build the plan and collect *every* problem (not just the first) for one clear report.

    ``node``: this box's place in a multi-node job (:mod:`outrig.ops.nodes` plans every node
    with its own); None plans a one-node job, or node 0 of a multi-node playbook shown alone
    (``outrig plan``), which a note says."""
    spec = job.spec
    place = node or single_node(host, run_id)
    plan = Plan(host=host.name, playbook=job.name, run_id=run_id, workdir=host.workdir,
                test_mode=job.test_mode, facts=facts, secrets=list(spec.secrets),
                files=[(f.remote, str(f.local)) for f in job.files],
                node_rank=place.rank, nnodes=place.nnodes, job_id=place.job_id)
    if node is None and spec.nodes > 1:
        plan.notes.append(
            f"{job.where(('nodes',))}: the job spans {spec.nodes} nodes; planned here as node "
            f"0 alone (nnodes 1). Deploy it with --host naming {spec.nodes} hosts, node 0 "
            "first.")
    job = _expand_recipe(job, host, facts, run_id, plan, place)
    spec = job.spec
    params: dict[str, object] = dict(spec.params)
    for key, value in builtin_params(host, job, run_id, node).items():
        if key in params:
            plan.problems.append(
                f"{job.where(('params', key))}: '{key}' is a built-in name "
                f"(set by outrig to {value!r}); rename the parameter"
            )
        params[key] = value

    for name, proc in spec.processes.items():
        rendered = _render_process(job, name, proc, params, plan.problems)
        if rendered is not None:
            plan.processes[name] = rendered

    if not spec.processes:
        plan.problems.append(
            f"{job.doc.path}: the playbook has only an evaluate: section and deploys nothing; "
            f"measure with outrig evaluate --host {host.name} --playbook {job.name}, or add "
            "processes: to deploy")
    _check_after(job, plan)
    _check_gpus(job, plan, facts)
    _check_set_aside(job, plan, facts)
    _check_parallel(job, plan)
    _check_launchers(job, plan)
    plan.order = _start_order(spec.processes)
    _note_idle_gpus(job, plan, facts)
    if facts.gpu_count is None and plan.max_gpu_index() is not None:
        plan.notes.append(
            "GPU count unknown until the box is contacted (hosts gpus: auto); the agent checks "
            "the GPU indices on the box before stopping or starting anything"
        )
    return plan


def _expand_recipe(job: Job, host: Host, facts: HostFacts, run_id: str, plan: Plan,
                   place: NodePlace) -> Job:
    """A recipe's processes join the playbook's own, so the generic checks see them all.

    Returns ``job`` itself when there is no recipe, else a copy whose spec holds the merged
    processes (recipe ones first) and whose ``where`` maps their key paths back to the
    recipe's section of the file.
    """
    spec = job.spec
    if spec.recipe is None:
        return job
    run_dir = str(builtin_params(host, job, run_id)["run_dir"])
    ctx = RecipeContext(host=host.name, playbook=job.name, run_id=run_id, run_dir=run_dir,
                        test_mode=job.test_mode, gpu_count=facts.gpu_count,
                        gpu_memory_mib=facts.gpu_memory_mib, gpu_source=facts.source,
                        models=facts.models, where=job.where, envs=facts.envs,
                        nodes=int(getattr(spec, "nodes", 1) or 1), node_rank=plan.node_rank,
                        node_hosts=place.hosts, head_declared=place.head_declared,
                        rdzv_port=spec.rdzv_port)
    expansion = recipes.get(spec.recipe).expand(spec.recipe_section(), ctx)
    plan.problems.extend(expansion.problems)
    plan.notes.extend(expansion.notes)
    plan.launch_with_head, plan.node_group = expansion.with_head, expansion.node_group
    aliases = {**job.aliases, **expansion.origins}
    merged: dict[str, ProcessSpec] = {}
    for name, raw in expansion.processes.items():
        if name in spec.processes:
            plan.problems.append(
                f"{job.where(('processes', name))}: the {spec.recipe} recipe already defines a "
                f"process named {name!r}; rename yours")
            continue
        try:
            merged[name] = ProcessSpec.model_validate(raw)
        except ValidationError as exc:  # a value from the recipe section broke the process
            prefix = aliases.get(("processes", name), (spec.recipe,))
            plan.problems.extend(validation_messages(job.doc, list(exc.errors()),
                                                     prefix=prefix))
    merged.update(spec.processes)
    return dataclasses.replace(job, spec=spec.model_copy(update={"processes": merged}),
                               aliases=aliases)


def _sub(job: Job, keypath: tuple[object, ...], text: str, params: dict[str, object],
         problems: list[str]) -> str:
    try:
        return substitute(text, params)
    except UndefinedName as exc:
        defined = ", ".join(sorted(params))
        for name in exc.names:
            problems.append(
                f"{job.where(keypath)}: ${{{name}}} is not defined; define it under params: "
                f"(defined names: {defined})"
            )
        for bad in exc.bad_syntax:
            problems.append(
                f"{job.where(keypath)}: {bad} is not a valid reference; use ${{name}} with a "
                "letter or _ first, or $${ for a literal"
            )
        return text


def _render_process(job: Job, name: str, proc: ProcessSpec, params: dict[str, object],
                    problems: list[str]) -> ProcessPlan | None:
    base = ("processes", name)
    argv = [_sub(job, (*base, "command"), part, params, problems) for part in proc.argv_template()]
    env: dict[str, str] = {}
    for key, value in proc.env.items():
        text = value if isinstance(value, str) else _scalar(value)
        env[key] = _sub(job, (*base, "env", key), text, params, problems)
    why = {"CUDA_VISIBLE_DEVICES": " from gpus:; list the GPUs there instead",
           "CUDA_DEVICE_ORDER": " (PCI_BUS_ID, so CUDA's indices are nvidia-smi's); remove it"}
    for key in LAUNCH_ENV_KEYS:
        why[key] = (" in every process it launches, to know the run's processes from anyone "
                    "else's when it stops them; remove it from env: (or give your variable "
                    "another name)")
    for reserved in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", *LAUNCH_ENV_KEYS):
        if reserved in env:
            problems.append(
                f"{job.where((*base, 'env', reserved))}: {reserved} is set by outrig"
                + why.get(reserved, "")
            )
    # NOTE: an empty CUDA_VISIBLE_DEVICES hides every GPU, so a CPU-only process can never
    # grab GPU 0 by accident (torch does that when the variable is unset).
    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in proc.gpus)
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    cwd = _sub(job, (*base, "cwd"), proc.cwd, params, problems) if proc.cwd else None
    if cwd is not None and not cwd.startswith(("/", "~")) and (
            os.path.normpath(cwd).split(os.sep)[0] == ".."):
        problems.append(f"{job.where((*base, 'cwd'))}: {cwd!r} leaves the workdir; give a "
                        "folder under it (relative, without '..' going above it) or an "
                        "absolute path")
    ready = None
    if proc.ready is not None:
        r = proc.ready
        port: int | None = None
        if r.port is not None:
            port_text = _sub(job, (*base, "ready", "port"), str(r.port), params, problems)
            try:
                port = int(port_text)
                if not 1 <= port <= 65535:
                    raise ValueError
            except ValueError:
                if "${" not in port_text:
                    problems.append(f"{job.where((*base, 'ready', 'port'))}: {port_text!r} is "
                                    "not a TCP port (1-65535)")
        ready = ReadyPlan(
            http=_sub(job, (*base, "ready", "http"), r.http, params, problems) if r.http else None,
            log=_sub(job, (*base, "ready", "log"), r.log, params, problems) if r.log else None,
            port=port, exit=r.exit, timeout=r.timeout,
            model=_sub(job, (*base, "ready", "model"), r.model, params, problems)
            if r.model else None,
            generate=r.generate,
        )
        if ready.http and "${" not in ready.http and not ready.http.startswith(
                ("http://", "https://")):
            problems.append(f"{job.where((*base, 'ready', 'http'))}: {ready.http!r} has no "
                            "scheme; write it as a full URL, e.g. "
                            f"'http://{ready.http.lstrip('/')}'")
    parallel = (proc.parallel.tensor, proc.parallel.data) if proc.parallel else None
    checkpoints = None
    if proc.checkpoints is not None:
        checkpoints = {"path": _sub(job, (*base, "checkpoints", "path"), proc.checkpoints.path,
                                    params, problems),
                       "scheduler": proc.checkpoints.scheduler}
    scratch = [_sub(job, (*base, "scratch", i), d, params, problems)
               for i, d in enumerate(proc.scratch)]
    return ProcessPlan(name=name, argv=argv, env=env, cwd=cwd, gpus=list(proc.gpus),
                       after=proc.after_names(), ready=ready, fatal=list(proc.fatal),
                       stop_grace=proc.stop.grace, parallel=parallel,
                       stop_children_first=proc.stop.children_first, checkpoints=checkpoints,
                       scratch=scratch)


def _scalar(value: object) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def _check_after(job: Job, plan: Plan) -> None:
    names = set(job.spec.processes)
    for name, proc in job.spec.processes.items():
        for dep in proc.after_names():
            if dep == name:
                plan.problems.append(f"{job.where(('processes', name, 'after'))}: {name} cannot "
                                     "start after itself")
            elif dep not in names:
                plan.problems.append(
                    f"{job.where(('processes', name, 'after'))}: unknown process {dep!r}; "
                    f"processes are: {', '.join(sorted(names))}"
                )
    cycle = _find_cycle({n: [d for d in p.after_names() if d in names and d != n]
                         for n, p in job.spec.processes.items()})
    if cycle:
        plan.problems.append(
            f"{job.where(('processes', cycle[0], 'after'))}: 'after' forms a cycle "
            f"({' → '.join([*cycle, cycle[0]])}); nothing could ever start. Remove one edge."
        )


def _find_cycle(graph: dict[str, list[str]]) -> list[str] | None:
    """A cycle in ``graph`` (node → deps) as a node list, or None. Deterministic order."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in graph.get(node, []):
            if state.get(dep) == 1:
                return stack[stack.index(dep):]
            if dep not in state:
                found = visit(dep)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in graph:
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def _start_order(processes: dict[str, ProcessSpec]) -> list[str]:
    """Topological order, keeping the file's order among independent processes."""
    done: list[str] = []
    remaining = list(processes)
    while remaining:
        for name in remaining:
            deps = [d for d in processes[name].after_names() if d in processes and d != name]
            if all(d in done for d in deps):
                done.append(name)
                remaining.remove(name)
                break
        else:  # a cycle (already reported): append the rest in file order
            done.extend(remaining)
            break
    return done


def _note_idle_gpus(job: Job, plan: Plan, facts: HostFacts) -> None:
    """A job that leaves GPUs of the box unused says so: on an 8-GPU box a playbook written
    for 4 runs on 0-3 and the other four cost the same rent doing nothing."""
    if not facts.gpu_count:
        return
    used = {gpu for proc in job.spec.processes.values() for gpu in proc.gpus}
    idle = sorted(set(range(facts.gpu_count)) - used)
    if used and idle:
        plan.notes.append(
            f"GPUs {ranges(idle)} of {plan.host}'s {facts.gpu_count} stay idle: no process "
            "is given them (another run can take them, or give this job more: a variant "
            "playbook for this box, e.g. more server replicas)")


def _check_gpus(job: Job, plan: Plan, facts: HostFacts) -> None:
    owner: dict[int, str] = {}
    for name, proc in job.spec.processes.items():
        for gpu in proc.gpus:
            if gpu in owner:
                plan.problems.append(
                    f"{job.where(('processes', name, 'gpus'))}: GPU {gpu} is given to both "
                    f"{owner[gpu]} and {name}; two processes on one GPU starve each other of "
                    "memory. Give each process its own GPUs."
                )
            else:
                owner[gpu] = name
            if facts.gpu_count is not None and gpu >= facts.gpu_count:
                have = f"0-{facts.gpu_count - 1}" if facts.gpu_count else "none"
                plan.problems.append(
                    f"{job.where(('processes', name, 'gpus'))}: GPU {gpu} does not exist on "
                    f"{plan.host}, which has {facts.gpu_count} GPU(s) ({have}; {facts.source}). "
                    "Use an index that exists or another host."
                )


def _check_set_aside(job: Job, plan: Plan, facts: HostFacts) -> None:
    """``evaluate.during_training.gpus``: set aside for the evaluation server while training
    goes on, so no process of the run may have one (the server would starve the trainer of
    memory, or be refused as holding a GPU of a running run), and each must exist."""
    during = job.spec.evaluate.during_training if job.spec.evaluate else None
    if during is not None and during.host == plan.host:
        plan.problems.append(
            f"{job.where(('evaluate', 'during_training', 'host'))}: {during.host} is the box "
            "the run trains on; name a second box, or set aside GPUs of this one (gpus: [...])")
    if during is None or not during.gpus:
        return
    where = job.where(("evaluate", "during_training", "gpus"))
    for name, proc in job.spec.processes.items():
        shared = sorted(set(proc.gpus) & set(during.gpus))
        if shared:
            plan.problems.append(
                f"{where}: GPU(s) {shared} are set aside for evaluating checkpoints but "
                f"{name} runs on them too; set aside GPUs no process of the run uses, or "
                "evaluate on a second box (host: H)")
    if facts.gpu_count is not None:
        missing = [g for g in during.gpus if g >= facts.gpu_count]
        if missing:
            plan.problems.append(
                f"{where}: GPU(s) {missing} do not exist on {plan.host}, which has "
                f"{facts.gpu_count} GPU(s) ({facts.source}); set aside GPUs it has")


def _check_parallel(job: Job, plan: Plan) -> None:
    for name, proc in job.spec.processes.items():
        if proc.parallel is None:
            continue
        tp, dp = proc.parallel.tensor, proc.parallel.data
        if tp * dp != len(proc.gpus):
            plan.problems.append(
                f"{job.where(('processes', name, 'parallel'))}: tensor {tp} × data {dp} = "
                f"{tp * dp} GPUs, but {name} has {len(proc.gpus)} GPU(s) {proc.gpus}. vLLM would "
                f"die minutes in with 'DP adjusted local rank N is out of bounds'. Give it "
                f"{tp * dp} GPUs or change tensor/data so that tensor × data = {len(proc.gpus)}."
            )


def _check_launchers(job: Job, plan: Plan) -> None:
    """A pasted ``vllm serve`` or ``torchrun`` command: its own parallel flags against
    ``gpus:``, as ``parallel:`` is checked; a shell command says that nothing was checked.
    A recipe's own processes (their key path aliased into the recipe's section) are left
    out: the recipe rendered their flags from sizes it checked itself (a spanning server's
    ``--nnodes``/``--headless`` would read as "not checked" here)."""
    for name, proc in job.spec.processes.items():
        rendered = plan.processes.get(name)
        if rendered is None or ("processes", name) in job.aliases:
            continue
        template = read_launch(proc.argv_template(), rendered.env)
        launch = read_launch(rendered.argv, rendered.env)
        parallel = (proc.parallel.tensor, proc.parallel.data) if proc.parallel else None
        found = check_launch(launch, name, list(proc.gpus), parallel, job.spec.nodes,
                             nnodes_literal="${" not in template.flags.get("nnodes", ""))
        where = job.where(("processes", name, "command"))
        plan.problems.extend(f"{where}: {text}" for text in found.problems)
        plan.notes.extend(f"{where}: {text}" for text in found.notes)
