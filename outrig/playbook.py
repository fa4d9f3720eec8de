"""Playbooks: ``playbooks/NAME.yaml`` → a typed, validated :class:`Job`.

A playbook is a set of named processes (the generic layer). Everything is validated when the
file is loaded: unknown keys are errors (a misspelt ``gpu:`` must not silently mean "no GPUs"),
types are checked, and every error names the file, the key path and the line.

``test:`` holds overrides that ``--test`` deep-merges over the file before validation (fewer
samples, one epoch), so a test run is checked exactly like the real one.
"""

from __future__ import annotations

import copy
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional, Union, cast

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidatorFunctionWrapHandler,
    create_model,
    field_validator,
    model_validator,
)

from outrig import recipes
from outrig.errors import ConfigError, OutrigError, did_you_mean
from outrig.evaluation.section import EvaluateSpec
from outrig.formats.environments import EnvironmentSpec, RequiresSpec, check_environment_names
from outrig.formats.yamlfile import KeyPath, YamlDoc, load_yaml, validation_messages
from outrig.hang.spec import HangSpec
from outrig.recipes import Recipe

_PROCESS_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,39}$")
# The playbook name is a file name on the box (.outrig/current/<name>) and starts run ids.
_PLAYBOOK_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
ParamValue = Union[str, int, float, bool]  # noqa: UP007 (a runtime alias pydantic reads)
RDZV_PORT = 29400  # torchrun's c10d rendezvous port when --rdzv-endpoint names none


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ReadySpec(_Strict):
    """How to know a process is up. Any combination; all given conditions must hold."""

    http: str | None = Field(None, description="URL that must answer 2xx (e.g. vLLM's /health)")
    log: str | None = Field(None, description="regex that must match a line of the process log")
    port: int | str | None = Field(None, description="TCP port on 127.0.0.1 that must accept")
    exit: bool = Field(False, description="one-shot step: ready when it exited with code 0")
    model: str | None = Field(None, description="with http: the id /v1/models must serve as "
                              "data[0].id (vLLM); another id fails the deploy at once")
    generate: bool = Field(False, description="with model: once http and model hold, POST one "
                           "/v1/completions request (max_tokens 1) for that id; only a 2xx "
                           "answer is ready (vLLM answers /health before its engine has run "
                           "a request)")
    timeout: float = Field(120.0, gt=0, description="seconds before the wait fails")

    @model_validator(mode="after")
    def _generate_needs_model(self) -> ReadySpec:
        if self.generate and (self.model is None or self.http is None):
            raise ValueError("generate: true needs http and model (the served id the request "
                             "names), e.g. model: ${model}")
        return self

    @field_validator("log")
    @classmethod
    def _regex_compiles(cls, value: str | None) -> str | None:
        if value is not None:
            _check_regex(value)
        return value

    @field_validator("http")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://", "${")):
            raise ValueError(f"{value!r} has no scheme; write it as a full URL, e.g. "
                             f"'http://{value.lstrip('/')}'")
        return value


class StopSpec(_Strict):
    """How to stop: SIGTERM to the leader, then ``grace`` seconds, then SIGKILL the group."""

    grace: float = Field(10.0, ge=0, description="seconds between SIGTERM and SIGKILL")
    children_first: bool = Field(
        False, description="for launchers such as torchrun: SIGTERM the command's children "
        "(the ranks) directly and wait up to grace for them, then SIGTERM the leader")


class CheckpointsSpec(_Strict):
    """Where a trainer writes numbered checkpoints, and whether they hold a scheduler file."""

    path: str = Field(min_length=1, description="the trainer's --save-path")
    scheduler: bool = Field(True, description="false with --scheduler-type none (no "
                            "scheduler_state_dict.pt is written)")


class ParallelSpec(_Strict):
    """Declared model parallelism; the planner checks tensor × data == number of GPUs."""

    tensor: int = Field(1, ge=1)
    data: int = Field(1, ge=1)


class ProcessSpec(_Strict):
    """One long-running (or one-shot) process of a playbook."""

    command: str | list[str] = Field(description="argv as a list, or a string split like a shell")
    env: dict[str, str | int | float | bool] = Field(default_factory=dict)
    cwd: str | None = None
    gpus: list[int] = Field(default_factory=list, description="physical GPU indices")
    parallel: ParallelSpec | None = None
    after: str | list[str] = Field(default_factory=list)
    ready: ReadySpec | None = None
    fatal: list[str] = Field(default_factory=list, description="regexes that mean failure")
    stop: StopSpec = Field(default_factory=lambda: StopSpec())
    checkpoints: CheckpointsSpec | None = Field(
        None, description="a speculators-style save folder: before launch, numbered folders "
        "that are not complete are moved aside so the trainer cannot resume from them")
    scratch: list[str] = Field(
        default_factory=list, description="folders under the workdir whose files are deleted "
        "when the run is stopped or replaced (e.g. hidden-state files left by a crash)")

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key in value:
            if not _ENV_NAME.match(key):
                raise ValueError(
                    f"{key!r} is not an environment variable name (letters, digits and '_', "
                    "not starting with a digit); write env: as NAME: value lines")
        return value

    @field_validator("gpus")
    @classmethod
    def _gpus_non_negative(cls, value: list[int]) -> list[int]:
        for index in value:
            if index < 0:
                raise ValueError(f"GPU index {index} is negative; use indices as nvidia-smi shows")
        if len(set(value)) != len(value):
            raise ValueError(f"GPU list {value} names a GPU twice")
        return value

    @field_validator("fatal")
    @classmethod
    def _fatal_compiles(cls, value: list[str]) -> list[str]:
        for pattern in value:
            _check_regex(pattern)
        return value

    @field_validator("command")
    @classmethod
    def _command_not_empty(cls, value: str | list[str]) -> str | list[str]:
        if isinstance(value, str):
            try:
                parts = shlex.split(value)
            except ValueError as exc:
                raise ValueError(f"cannot split the command like a shell would: {exc}") from None
        else:
            parts = value
        if not parts:
            raise ValueError("command is empty")
        return value

    def after_names(self) -> list[str]:
        return [self.after] if isinstance(self.after, str) else list(self.after)

    def argv_template(self) -> list[str]:
        return shlex.split(self.command) if isinstance(self.command, str) else list(self.command)


class StageItemSpec(_Strict):
    """A folder the job needs on the box (model, data, checkpoints) and where it comes from.

    ``source``: ``hf:ORG/NAME[@REV]`` (the box downloads it itself), ``hf-dataset:...``, or a
    folder on the workstation. Without a source the item can only be copied from another
    box (``inv stage --from``, ``inv migrate``).
    """

    path: str = Field(min_length=1, description="absolute folder on the box")
    source: str | None = Field(None, description="hf:ORG/NAME[@REV], hf-dataset:..., or a "
                               "workstation folder")
    kind: Literal["model", "data", "checkpoints"] = "data"

    @field_validator("path")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith(("/", "~", "${")):
            raise ValueError(f"path {value!r} must be absolute (or start with ~ or "
                             "${workdir})")
        return value


class _PlaybookHead(_Strict):
    """The keys before ``recipe:``. The schema is assembled from parts (head, recipe sections,
    tail; see :func:`playbook_spec`) so that its keys keep the order the errors are told in."""

    name: str | None = None
    family: str | None = Field(
        None, description="playbooks of one job for different hardware share a family: "
        "checkpoints are mirrored per family, and `outrig migrate` picks the family member that "
        "fits the new box (default: the playbook's name)")
    description: str | None = None
    params: dict[str, ParamValue] = Field(default_factory=dict)
    secrets: list[str] = Field(
        default_factory=list,
        description="workstation environment variables passed to every process over the "
        "SSH channel (never in argv, logs, journal or messages)",
    )
    nodes: int = Field(
        1, description="machines the job spans: a count N (deploy --host names N hosts, "
        "node 0 first), or a list of host names (node 0 first); see docs/playbooks.md")
    rdzv_port: int = Field(
        RDZV_PORT, ge=1, le=65535, description="the rendezvous port on node 0, as "
        "${rdzv_port} (torchrun's c10d default)")
    # ``nodes:`` given as a list of hosts: kept here, ``nodes`` holds their count
    _node_hosts: tuple[str, ...] | None = PrivateAttr(None)

    @property
    def node_hosts(self) -> tuple[str, ...] | None:
        """The hosts ``nodes:`` listed (node 0 first), or None when it gave a count."""
        return self._node_hosts

    @field_validator("nodes", mode="before")
    @classmethod
    def _node_count(cls, value: Any) -> Any:
        """A list of hosts counts as its length (the list itself is kept by
        :meth:`_keep_node_hosts`); a count must be a whole number ≥ 1."""
        if isinstance(value, list):
            return len(check_node_hosts(value))
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"nodes: {value!r} is neither a count ≥ 1 nor a list of host "
                             "names; write e.g. nodes: 2 or nodes: [gpu-a, gpu-b]")
        return value

    @model_validator(mode="wrap")
    @classmethod
    def _keep_node_hosts(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        """Keep ``nodes:``'s host list (node 0 first) beside the count ``nodes`` holds."""
        model = handler(data)
        hosts = data.get("nodes") if isinstance(data, dict) else None
        if isinstance(hosts, list) and isinstance(model, _PlaybookHead):
            model._node_hosts = tuple(str(h) for h in hosts)
        return model

    @field_validator("name")
    @classmethod
    def _name_ok(cls, value: str | None) -> str | None:
        if value is not None and not _PLAYBOOK_NAME.match(value):
            raise ValueError(
                f"playbook name {value!r} must start with a letter or digit and hold only "
                "letters, digits, '.', '_' and '-' (at most 64): it names files on the box")
        return value

    @field_validator("secrets")
    @classmethod
    def _secret_names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name):
                raise ValueError(f"{name!r} is not an environment variable name")
        return value


def check_node_hosts(hosts: list[Any]) -> list[str]:
    """``nodes:`` as a list: host names (as ``--host`` takes them), each once."""
    if not hosts:
        raise ValueError("nodes: [] lists no host; give a count or at least one host name")
    for host in hosts:
        if not isinstance(host, str) or not host.strip():
            raise ValueError(f"nodes: {host!r} is not a host name; list names from hosts/ "
                             "(node 0 first)")
    twice = sorted({h for h in hosts if hosts.count(h) > 1})
    if twice:
        raise ValueError(f"nodes: {', '.join(twice)} is listed twice; each node of a job is "
                         "a different host")
    return [str(h) for h in hosts]


_RECIPE_HELP = "expand a recipe section (e.g. dflash:) into processes"


class _RecipeChoice(_PlaybookHead):
    """``recipe:``; :func:`playbook_spec` narrows it to the registered names."""

    recipe: str | None = Field(None, description=_RECIPE_HELP)


class _PlaybookTail(_Strict):
    """The keys after the recipe sections."""

    processes: dict[str, ProcessSpec] = Field(
        default_factory=dict, description="required unless a recipe provides them")
    files: dict[str, str] = Field(default_factory=dict, description="remote path → local path")
    stage: dict[str, StageItemSpec] = Field(
        default_factory=dict, description="folders `outrig stage` puts on the box, by name")
    test: dict[str, Any] | None = Field(None, description="overrides applied with --test")
    environments: dict[str, EnvironmentSpec] = Field(
        default_factory=dict, description="venvs `outrig provision` makes on the box, with pins")
    requires: RequiresSpec | None = Field(
        None, description="what the box must offer: python, NVIDIA driver, free disk")
    evaluate: EvaluateSpec | None = Field(
        None, description="what `outrig evaluate` serves and sends (docs/evaluate.md)")
    hang: HangSpec = Field(default_factory=lambda: HangSpec(), description="how watch and "
                           "status tell a hung process (docs/playbooks.md#hang)")
    spares: dict[str, Any] | None = Field(
        None, description="the spare `watch --spare auto` rents for this job: provider, gpus, "
        "max_price, release_dead (docs/providers.md); wins over outrig.yaml's")

    @field_validator("environments")
    @classmethod
    def _environment_names(cls, value: dict[str, EnvironmentSpec]) -> dict[str, EnvironmentSpec]:
        return check_environment_names(value)

    @field_validator("processes")
    @classmethod
    def _names_ok(cls, value: dict[str, ProcessSpec]) -> dict[str, ProcessSpec]:
        for name in value:
            if not _PROCESS_NAME.match(name):
                raise ValueError(
                    f"process name {name!r} must start with a letter and hold only letters, "
                    "digits, '-' and '_' (it names a log file on the box)"
                )
        return value

    @field_validator("files")
    @classmethod
    def _remote_paths_relative(cls, value: dict[str, str]) -> dict[str, str]:
        for remote in value:
            parts = Path(remote).parts
            if Path(remote).is_absolute() or ".." in parts or not parts:
                raise ValueError(
                    f"remote file path {remote!r} must be relative to the host's workdir "
                    "and stay inside it (no leading '/', no '..')"
                )
        return value


class PlaybookBase(_PlaybookTail, _RecipeChoice):
    """Every key but the recipe sections: what code outside the schema may rely on.

    A loaded playbook is a :func:`playbook_spec` model, a subclass that adds one optional
    section per registered recipe."""

    def recipe_section(self) -> Any:
        """The validated section of the playbook's recipe (e.g. its ``dflash:``), or None."""
        return getattr(self, self.recipe, None) if self.recipe else None


_SPECS: dict[tuple[Recipe[Any], ...], type[PlaybookBase]] = {}


def playbook_spec() -> type[PlaybookBase]:
    """The whole file's schema for the recipes registered now (built once per registry state).

    ``recipe:`` becomes a choice among their names and each gets its optional section, typed
    by its own model, so a bad section's errors name the key and line like any other key.
    The sections sit between the head and the tail, where ``dflash:`` always was: pydantic
    orders keys by the reversed MRO, which is head, recipe sections, tail here.
    """
    key = tuple(recipes.RECIPES.values())
    if key not in _SPECS:
        _SPECS[key] = _build_spec(key)
    return _SPECS[key]


def _build_spec(registered: tuple[Recipe[Any], ...]) -> type[PlaybookBase]:
    """See :func:`playbook_spec`."""
    clash = sorted({r.name for r in registered} & set(PlaybookBase.model_fields))
    if clash:
        raise ValueError(f"recipe name(s) {clash} are playbook keys already; rename the recipe")
    names = tuple(r.name for r in registered)
    choice: Any = Optional[Literal[names]] if names else None  # noqa: UP045
    sections: dict[str, Any] = {
        r.name: (Optional[r.section],  # noqa: UP045
                 Field(None, description=f"the {r.name} recipe's parameters"))
        for r in registered}
    middle = create_model("_RecipeSections", __base__=_RecipeChoice, **sections)
    bases: Any = (PlaybookBase, middle)  # PlaybookBase first: the result is one (for typing)
    return cast("type[PlaybookBase]", create_model(
        "PlaybookSpec", __base__=bases, __doc__="The whole file.", __module__=__name__,
        recipe=(choice, Field(None, description=_RECIPE_HELP))))


PlaybookSpec = playbook_spec()  # the built-in recipes' schema (docs, tests, JSON schema)


@dataclass(frozen=True)
class LocalFile:
    """A file to push: where it goes (relative to the workdir) and where it is here."""

    remote: str
    local: Path


@dataclass
class Job:
    """A loaded playbook: the validated spec plus where it came from (for messages)."""

    name: str
    spec: PlaybookBase
    doc: YamlDoc
    test_mode: bool
    files: list[LocalFile] = field(default_factory=list)
    # Processes a recipe made have no ``processes.X`` key in the file; messages about them
    # point at the recipe's section instead (longest matching prefix wins).
    aliases: dict[KeyPath, KeyPath] = field(default_factory=dict)

    def where(self, keypath: KeyPath) -> str:
        keypath = tuple(keypath)
        for prefix in sorted(self.aliases, key=len, reverse=True):
            if keypath[: len(prefix)] == prefix:
                keypath = (*self.aliases[prefix], *keypath[len(prefix):])
                break
        return self.doc.where(keypath)


def _check_regex(pattern: str) -> None:
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"regex {pattern!r} does not compile: {exc}") from None


def _recipe_shape_errors(raw: dict[str, Any]) -> list[dict[str, Any]]:
    """``processes:`` or a recipe, and a recipe with its section (pydantic-shaped errors)."""
    recipe = raw.get("recipe")
    errors: list[dict[str, Any]] = []
    # an evaluate-only playbook (a drafter trained elsewhere, vLLM's ngram) deploys nothing
    if recipe is None and not raw.get("processes") and raw.get("evaluate") is None:
        kind = "missing" if "processes" not in raw else "value_error"
        named = " or ".join(f"recipe: {name}" for name in recipes.names())
        errors.append({"type": kind, "loc": ("processes",),
                       "msg": f"list at least one process, or name a recipe ({named}), or "
                              "give only an evaluate: section (for outrig evaluate)"})
    if isinstance(recipe, str) and recipe in recipes.RECIPES and raw.get(recipe) is None:
        docs = recipes.get(recipe).docs
        errors.append({"type": "value_error", "loc": ("recipe",),
                       "msg": f"recipe: {recipe} needs a '{recipe}:' section with its "
                              "parameters" + (f" (see {docs})" if docs else "")})
    for name in recipes.names():
        if raw.get(name) is not None and recipe != name:
            errors.append({"type": "value_error", "loc": (name,),
                           "msg": f"a '{name}:' section is only used with recipe: {name}; "
                                  "add that line or remove the section"})
    return errors


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Mappings merge key by key; anything else (lists included) is replaced."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


@dataclass(frozen=True)
class PlaybookRef:
    """``--playbook X`` resolved once (:func:`resolve_playbook`): ``name`` is its identity,
    the ``name:`` its runs are filed under on the box and in the journal, which every lookup
    of a run uses; ``path`` the file it deploys from, None when this project has no file of
    that name (a run deployed from another checkout is still found by its name)."""

    given: str
    name: str
    path: Path | None


def _is_path(value: str) -> bool:
    return Path(value).suffix in {".yaml", ".yml"} or "/" in value


def _filed_name(path: Path) -> str:
    """The name a playbook file's runs are filed under: its ``name:``, else its file name
    (read without validating the rest: a lookup must not fail on an unrelated key)."""
    data = load_yaml(path, what="playbook").data
    name = data.get("name") if isinstance(data, dict) else None
    return name if isinstance(name, str) and name else path.stem


def _files_named(name: str, playbooks_dir: Path) -> list[Path]:
    """The project's playbook files whose ``name:`` is ``name`` (unreadable ones skipped:
    they name nothing)."""
    if not playbooks_dir.is_dir():
        return []
    found = []
    for path in sorted(playbooks_dir.glob("*.y*ml")):
        try:
            if _filed_name(path) == name:
                found.append(path)
        except ConfigError:
            continue
    return found


def resolve_playbook(value: str, playbooks_dir: Path) -> PlaybookRef:
    """``--playbook X`` as every command means it, in this order: a path (``.yaml``/``.yml``
    or a ``/``) is that file; else ``playbooks/X.yaml``; else the one file in playbooks/
    whose ``name:`` is X; else X is taken as the name runs are filed under (no file here).
    Two files with ``name: X`` (and no ``X.yaml``) are ambiguous: a ConfigError names them."""
    if _is_path(value):
        path = find_playbook(value, playbooks_dir)
        return PlaybookRef(value, _filed_name(path), path)
    for suffix in (".yaml", ".yml"):
        path = playbooks_dir / f"{value}{suffix}"
        if path.is_file():
            return PlaybookRef(value, _filed_name(path), path)
        _refuse_folder(path)
    named = _files_named(value, playbooks_dir)
    if len(named) > 1:
        raise ConfigError(
            f"playbook {value!r}: {len(named)} files in {playbooks_dir} say name: {value} "
            f"({', '.join(p.name for p in named)}); pass the one you mean as a path, or give "
            "them different names. Nothing was sent.")
    return PlaybookRef(value, value, named[0] if named else None)


def _refuse_folder(path: Path) -> None:
    """``--playbook`` naming a folder: say so (it exists; "does not exist" was wrong)."""
    if path.is_dir():
        raise ConfigError(f"--playbook {path} is a folder, not a playbook file; pass the "
                          f"playbook .yaml file itself (e.g. {path / 'NAME.yaml'}). "
                          "Nothing was sent.")


def find_playbook(name_or_path: str, playbooks_dir: Path) -> Path:
    """The file ``--playbook`` names (see :func:`resolve_playbook`): ``dflash-qwen36`` →
    ``playbooks/dflash-qwen36.yaml``, else the file whose ``name:`` is that; a path is taken
    as it is."""
    candidate = Path(name_or_path).expanduser()
    if _is_path(name_or_path):
        if candidate.is_file():
            return candidate
        _refuse_folder(candidate)
        raise ConfigError(f"playbook file {candidate} does not exist")
    path = resolve_playbook(name_or_path, playbooks_dir).path
    if path is not None:
        return path
    _refuse_folder(candidate)  # not a playbook's name, but a folder here
    known = sorted(p.stem for p in playbooks_dir.glob("*.y*ml") if p.is_file()) \
        if playbooks_dir.is_dir() else []
    hint = f" Known playbooks: {', '.join(known)}." if known else ""
    hint += did_you_mean(name_or_path, known)
    raise ConfigError(
        f"unknown playbook {name_or_path!r}: no {playbooks_dir}/{name_or_path}.yaml and no "
        f"playbook there says name: {name_or_path}.{hint} "
        "Pass --playbook NAME or a path to a .yaml file."
    )


def override_params(raw: dict[str, Any], params: dict[str, Any], path: Path) -> dict[str, Any]:
    """``raw`` with ``params`` replacing its ``params:`` values. Only names the playbook
    declares may be set: a typo would otherwise be ignored while the user thinks it applied."""
    declared = raw.get("params")
    declared = declared if isinstance(declared, dict) else {}
    unknown = sorted(set(params) - set(declared))
    if unknown:
        have = ", ".join(sorted(map(str, declared))) or "none"
        raise ConfigError(
            f"--param {', '.join(unknown)}: {path} has no such param (its params: {have}); "
            "fix the name or add it under params: in the playbook. Nothing was sent.")
    return {**raw, "params": {**declared, **params}}


def load_job(path: Path, *, test: bool = False, base_dir: Path | None = None,
             params: dict[str, Any] | None = None, text: str | None = None) -> Job:
    """Load and validate a playbook file. ``test`` applies its ``test:`` overrides, then
    ``params`` (``--param key=value``) replace values of the playbook's ``params:``.

    ``files:`` local paths are resolved against ``base_dir`` (default: the project root, i.e.
    the parent of a ``playbooks/`` folder, else the playbook's own folder) and must exist.
    ``text``: the playbook as it was deployed (a run's record), loaded instead of the file
    ``path`` holds now.
    """
    doc = load_yaml(path, what="playbook", text=text)
    raw = doc.data
    if test:
        overrides = raw.get("test")
        if overrides is None and raw.get("recipe") is not None:
            overrides = {}  # a recipe has its own test mode (e.g. dflash: one epoch, few samples)
        if overrides is None:
            raise ConfigError(
                f"{path}: --test was given but the playbook has no 'test:' section; add one "
                "(e.g. test: {params: {steps: 5}}) or drop --test"
            )
        if not isinstance(overrides, dict):
            raise ConfigError(f"{doc.where(('test',))}: must be a mapping of overrides")
        raw = deep_merge({k: v for k, v in raw.items() if k != "test"}, overrides)
        raw["test"] = overrides
    if params:
        raw = override_params(raw, params, path)
    errors: list[Any] = []
    spec: PlaybookBase | None = None
    try:
        spec = playbook_spec().model_validate(raw)
    except ValidationError as exc:
        errors = list(exc.errors())
    errors += _recipe_shape_errors(raw)
    if errors or spec is None:
        lines = validation_messages(doc, errors)
        plural = "s" if len(lines) != 1 else ""
        raise ConfigError(
            f"playbook {path} is not valid ({len(lines)} problem{plural}):\n"
            + "\n".join(f"  - {line}" for line in lines)
        ) from None
    name = spec.name or path.stem
    if not _PLAYBOOK_NAME.match(name):
        raise ConfigError(
            f"{path}: the playbook is named after its file, {name!r}, which cannot name files "
            "on the box; add name: with letters, digits, '.', '_' and '-' only, or rename it")
    if base_dir is None:
        base_dir = path.parent.parent if path.parent.name == "playbooks" else path.parent
    files: list[LocalFile] = []
    for remote, local in spec.files.items():
        local_path = Path(local).expanduser()
        if not local_path.is_absolute():
            local_path = base_dir / local_path
        if not local_path.is_file():
            raise ConfigError(
                f"{doc.where(('files', remote))}: local file {local_path} does not exist; "
                "fix the path (relative paths start at the project root)"
            )
        files.append(LocalFile(remote=remote, local=local_path))
    return Job(name=name, spec=spec, doc=doc, test_mode=test, files=files)


def flag_job(raw: dict[str, Any], root: Path) -> Job:
    """A playbook made from a command's flags (``outrig evaluate --model M --speculative
    JSON``), validated like a file; its messages name ``<command line>`` (under ``root``,
    where relative paths start)."""
    doc = YamlDoc(path=root / "<command line>", data=raw)
    try:
        spec = playbook_spec().model_validate(raw)
    except ValidationError as exc:
        lines = validation_messages(doc, list(exc.errors()))
        raise ConfigError("the flags do not make a valid evaluation:\n"
                          + "\n".join(f"  - {line}" for line in lines)) from None
    return Job(name=str(raw["name"]), spec=spec, doc=doc, test_mode=False)


def hang_settings(playbooks_dir: Path, playbook: str | None) -> dict[str, Any] | None:
    """The ``hang:`` section (plain JSON) of the playbook ``playbook`` names, or None when it
    cannot be read here (moved, renamed, broken: the hang judge keeps the settings it had)."""
    if not playbook:
        return None
    try:
        return load_job(find_playbook(playbook, playbooks_dir)).spec.hang.settings()
    except (OutrigError, OSError):
        return None
