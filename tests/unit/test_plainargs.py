"""Plain command lines (outrig/cli/plainargs.py) are read exactly as Invoke reads them: for every
task, each of its flags in each form, the keyword arguments the task is called with are the
ones Invoke's parser gives; anything else is left to Invoke (None); the config a plain call
gets holds what Invoke's would; and a plain command imports no Invoke."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from invoke.parser.context import to_flag

from outrig.cli import TASKS, make_collection
from outrig.cli.plainargs import PlainConfig, config_files, plain_call
from outrig.cli.taskspec import TaskSpec
from outrig.formats.project_file import SETTINGS

NONE: list[Path] = []  # no Invoke config file


def invokes_kwargs(words: list[str]) -> dict[str, Any]:
    """What Invoke's executor would call the task with (invoke/executor.py: the parser
    context's ``as_kwargs``)."""
    from invoke.parser import Parser

    parser = Parser(contexts=make_collection().to_contexts())
    result = parser.parse_argv(words)
    assert len(result) == 1 and result[0].name == words[0]
    kwargs: dict[str, Any] = result[0].as_kwargs
    return kwargs


def flag_lines(spec: TaskSpec) -> list[list[str]]:
    """Command lines of ``spec``: each flag alone in each form, then all of them at once."""
    iterable = set(spec.options.get("iterable") or ())
    lines: list[list[str]] = [[spec.name]]
    every: list[str] = [spec.name]
    for name, param in list(inspect.signature(spec.body).parameters.items())[1:]:
        flag = to_flag(name)
        if len(flag) == 2:  # -o: a short flag, left to Invoke
            assert plain_call(TASKS, [spec.name, flag, "v"], config_paths=NONE) is None
            continue
        if param.default is False:
            lines.append([spec.name, flag])
            every.append(flag)
        elif name in iterable:
            lines.append([spec.name, flag, "a,b", f"{flag}=c d"])
            every += [flag, "x", flag, "y"]
        else:
            lines += [[spec.name, flag, "v a l"], [spec.name, f"{flag}=w=1"]]
            every += [flag, "z"]
    return [*lines, every]


@pytest.mark.parametrize("spec", TASKS, ids=[t.name for t in TASKS])
def test_every_flag_of_every_task_is_read_as_invoke_reads_it(spec: TaskSpec) -> None:
    positional = [name for name, p in list(inspect.signature(spec.body).parameters.items())[1:]
                  if p.default is inspect.Parameter.empty]
    if positional:  # ``release BOX``: a positional argument is Invoke's to read
        words = [spec.name, *("v" for _ in positional)]
        assert plain_call(TASKS, words, config_paths=NONE) is None
        assert invokes_kwargs(words)[positional[0]] == "v"
        return
    for words in flag_lines(spec):
        call = plain_call(TASKS, words, config_paths=NONE)
        assert call is not None, words
        assert call.task is spec
        assert call.kwargs == invokes_kwargs(words), words


@pytest.mark.parametrize("words", [
    [],
    ["no-such-task"],
    ["--list"],
    ["--version"],
    ["--complete", "--", "outrig", "st"],
    ["status", "--help"],
    ["status", "-h"],
    ["status", "--help=host"],
    ["status", "--bogus"],
    ["status", "--host"],                    # no value: Invoke's own refusal names the flag
    ["status", "--host", "--json"],
    ["status", "--host="],
    ["status", "--host", "-x"],
    ["status", "--run", "a", "--run", "b"],  # one value given twice
    ["status", "--json", "--json"],
    ["status", "--json=true"],
    ["status", "--no_keep"],                 # Invoke's spelling is --no-keep
    ["status", "--host", "box", "check"],    # a second task
    ["status", "box"],
    ["exec", "--host", "box", "--", "nvidia-smi"],
    ["status", "-H", "box"],
])
def test_what_is_not_plain_is_left_to_invoke(words: list[str]) -> None:
    assert plain_call(TASKS, words, config_paths=NONE) is None


def test_an_invoke_config_file_leaves_every_command_line_to_invoke(tmp_path: Path) -> None:
    config = tmp_path / ".outrig.yaml"
    words = ["status", "--host", "box"]
    assert plain_call(TASKS, words, config_paths=[config]) is not None
    config.write_text("host: box\n")
    assert plain_call(TASKS, words, config_paths=[config]) is None


def test_the_config_files_are_the_ones_invoke_loads(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Each path config_files names, written with a value, is read by Invoke's config (the
    user's ones: /etc is not ours to write)."""
    from outrig.cli.invoke_program import OutrigConfig

    monkeypatch.setenv("HOME", str(tmp_path))
    user = [p for p in config_files() if str(p).startswith(str(tmp_path))]
    assert [p.name for p in user] == [".outrig.yaml", ".outrig.yml", ".outrig.json",
                                      ".outrig.py"]
    assert [str(p) for p in config_files() if p not in user] == [
        "/etc/outrig.yaml", "/etc/outrig.yml", "/etc/outrig.json", "/etc/outrig.py"]
    bodies = {".yaml": "playbook: from-file\n", ".yml": "playbook: from-file\n",
              ".json": '{"playbook": "from-file"}', ".py": "playbook = 'from-file'\n"}
    for path in user:
        path.write_text(bodies[path.suffix])
        config = OutrigConfig(lazy=True)
        config.load_user()
        assert config.get("playbook") == "from-file", path
        path.unlink()


def test_the_plain_config_holds_what_invokes_would(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """With no config file, Invoke's config for outrig's keys is the OUTRIG_* variables."""
    from outrig.cli.invoke_program import OutrigConfig

    monkeypatch.setenv("HOME", str(tmp_path))
    assert not any(p.exists() for p in config_files()), "this machine has an Invoke config"
    monkeypatch.setenv("OUTRIG_HOST", "from-env")
    monkeypatch.setenv("OUTRIG_PLAYBOOK", "pb")
    monkeypatch.delenv("OUTRIG_PROJECT", raising=False)
    config = OutrigConfig(lazy=True)
    config.load_system()
    config.load_user()
    config.load_shell_env()
    plain = PlainConfig()
    for key in (*SETTINGS, "keep_seconds", "on_event"):
        assert plain.get(key) == config.get(key), key


PROBE = """
import sys
from outrig.cli import program
try:
    program.run(["outrig", *sys.argv[1:]])
except SystemExit as exc:
    print("exit", exc.code, file=sys.stderr)
print("invoke" in sys.modules, "pydantic" in sys.modules, file=sys.stderr)
"""


def run_probe(*args: str, home: Path) -> tuple[str, list[str]]:
    done = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True,
                          text=True, timeout=120, cwd=home, env={"HOME": str(home),
                                                                  "PATH": "/usr/bin:/bin"})
    lines = done.stderr.strip().splitlines()
    return "\n".join(lines[:-1]), lines[-1].split()


def test_a_plain_command_runs_without_invoke_or_pydantic(tmp_path: Path) -> None:
    """``status --host local`` (the agent on this machine, no SSH) runs its task to the end
    with neither Invoke nor pydantic imported."""
    err, imports = run_probe("status", "--host", "local", home=tmp_path)
    assert imports == ["False", "False"], err
    assert "exit" not in err


def test_a_plain_refusal_reads_as_invokes(tmp_path: Path) -> None:
    """``status --host no-such-host``: the plain call refuses the host (exit 2, its message);
    the same refusal through Invoke's program (a config file makes the line not plain)
    reads the same."""
    plain_err, _ = run_probe("status", "--host", "no-such-host", home=tmp_path)
    assert plain_err.splitlines()[-1] == "exit 2" and "no-such-host" in plain_err
    (tmp_path / ".outrig.yaml").write_text("{}\n")
    invoke_err, invoke_imports = run_probe("status", "--host", "no-such-host", home=tmp_path)
    assert invoke_imports[0] == "True"
    assert invoke_err == plain_err
