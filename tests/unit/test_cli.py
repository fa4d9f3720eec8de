"""The command line without a box: where defaults come from, --param, and Invoke's parse
errors turned into one paragraph with exit status 2 (``outrig`` in-process, ``inv`` as a
subprocess of this checkout)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from outrig.cli import make_collection
from outrig.cli.settings import parse_params
from outrig.errors import ConfigError
from outrig.journal import Journal
from tests.support.cli import outrig
from tests.support.hosts import write_host_file

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Two local hosts and a playbook; the current folder is the project."""
    root = tmp_path / "proj"
    for name in ("one", "two", "three", "four"):
        path = root / "hosts" / f"{name}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump({"hostname": "local", "workdir": f"/tmp/x-{name}"}))
    (root / "playbooks").mkdir()
    (root / "playbooks" / "job.yaml").write_text(yaml.safe_dump({
        "name": "job", "params": {"n": 1, "word": "a"},
        "processes": {"a": {"command": "echo ${n} ${word}", "gpus": []}}}))
    monkeypatch.chdir(root)
    for var in ("OUTRIG_HOST", "OUTRIG_PLAYBOOK", "OUTRIG_PROJECT"):
        monkeypatch.delenv(var, raising=False)
    return root


def planned_host(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    code, out, err = outrig(["plan", "--playbook", "job", "--json", *args], capsys)
    assert code == 0, err
    return str(json.loads(out)["host"])


def test_host_precedence_flag_env_project_file_user_file(
        project: Path, isolated_home: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    (isolated_home / ".outrig.yaml").write_text("host: four\n")
    assert planned_host(capsys) == "four"  # the user file, read by Invoke
    (project / "outrig.yaml").write_text("host: three\n")
    assert planned_host(capsys) == "three"  # the project file beats the user file
    monkeypatch.setenv("OUTRIG_HOST", "two")
    assert planned_host(capsys) == "two"  # the environment beats both files
    assert planned_host(capsys, "--host", "one") == "one"  # the flag beats everything


def test_outrig_reads_the_projects_invoke_yaml_below_outrig_yaml(
        project: Path, isolated_home: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    (isolated_home / ".outrig.yaml").write_text("host: four\n")
    (project / "invoke.yaml").write_text("host: two\nplaybook: job\n")
    code, out, err = outrig(["plan", "--json"], capsys)  # host and playbook from invoke.yaml
    assert code == 0, err
    assert json.loads(out)["host"] == "two"
    assert f"playbook job (playbook: in {project / 'invoke.yaml'})" in err
    (project / "outrig.yaml").write_text("host: three\n")
    assert planned_host(capsys) == "three"  # outrig.yaml beats invoke.yaml
    monkeypatch.setenv("OUTRIG_HOST", "one")
    assert planned_host(capsys) == "one"  # the environment beats both
    (project / "invoke.yaml").write_text("host: [not, a, name]\n")
    code, _, err = outrig(["plan", "--playbook", "job"], capsys)
    assert code == 2 and "invoke.yaml: host: must be a name" in err


def test_no_host_anywhere_is_exit_2_naming_the_ways_to_give_one(
        project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = outrig(["plan", "--playbook", "job"], capsys)
    assert code == 2
    assert "no host given: pass --host NAME" in err and "OUTRIG_HOST" in err
    assert "Traceback" not in err


def test_deploy_without_a_playbook_never_picks_one_silently(
        project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = outrig(["deploy", "--host", "one", "--dry-run"], capsys)
    assert code == 2
    assert "which playbook to deploy?" in err and "one has no current run" in err
    assert "job" in err  # the playbooks there are listed
    Journal().record_run("job-1", {"run_id": "job-1", "host": "one", "playbook": "job",
                                   "status": "running", "created": 1.0})
    code, _, err = outrig(["deploy", "--host", "one", "--dry-run"], capsys)
    assert code == 0, err
    assert "playbook job (the current run on one, job-1)" in err


def test_param_overrides_reach_the_plan_and_unknown_names_are_refused(
        project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = outrig(["plan", "--host", "one", "--playbook", "job", "--json",
                             "--param", "n=5", "--param", "word=two words"], capsys)
    assert code == 0, err
    assert json.loads(out)["processes"][0]["argv"] == ["echo", "5", "two words"]
    code, _, err = outrig(["plan", "--host", "one", "--playbook", "job", "--param", "m=5"],
                          capsys)
    assert code == 2 and "--param m:" in err and "its params: n, word" in err
    with pytest.raises(ConfigError, match="expected key=value"):
        parse_params(["novalue"])
    assert parse_params(["a=5", "b=x=y", "c=true", "d="]) == {"a": 5, "b": "x=y", "c": True,
                                                              "d": ""}


@pytest.mark.parametrize("args, flag", [
    (["status", "--lines", "abc"], "--lines must be a whole number"),
    (["cleanup", "--timeout", "soon"], "--timeout must be a number"),
    (["watch", "--host"], "--host needed value"),
    (["status", "--nope"], "No idea what '--nope' is"),
    (["nosuchtask"], "No idea what 'nosuchtask' is"),
    (["exec", "nvidia-smi"], "the command goes after --, e.g. `outrig exec --host NAME --"),
    (["tail-logs", "--since", "1h"], "No idea what '--since' is"),  # no flag that only refuses
    # issue 40: each task ran in turn; "No idea what 'b' is"
    (["runs", "--playbook", "job", "cleanup", "--run", "job-1"],
     "`runs` and `cleanup` are 2 tasks on one command line"),
    (["deploy", "--playbook", "a", "--playbook", "b"], "--playbook given twice ('a' and 'b')"),
    (["deploy", "--playbook=a", "--playbook=b"], "--playbook given twice ('a' and 'b')"),
    (["status", "--lines", "3", "--lines", "4"], "--lines given twice"),
    # the box refused it, after connecting (`--host one` is local: no box at all here)
    (["status", "--host", "one", "--lines=-1"], "--lines must be from 0 to 10000, not -1"),
    (["status", "--host", "one", "--lines", "-1"], "--lines must be from 0 to 10000, not -1"),
    (["status", "--host", "one", "--lines", "10001"], "--lines must be from 0 to 10000"),
    (["tail-logs", "--host", "one", "--lines=-5"], "--lines must be from 0 to 1000000000, not -5"),
])
def test_parse_errors_exit_2_with_one_paragraph(project: Path, args: list[str], flag: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = outrig(args, capsys)
    assert code == 2, err
    assert flag in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("args, said", [
    (["statsu"], "No idea what 'statsu' is (did you mean 'status'?); see `outrig --list`"),
    (["status", "--hots", "x"], "No idea what '--hots' is (did you mean '--host'?); see "
     "`outrig --help status`"),
    (["--hots", "x"], "(did you mean '--host'? It is a task's flag and goes after the task: "
     "`outrig status --host ...`)"),
    (["--lsit"], "No idea what '--lsit' is (did you mean '--list'?)"),
    (["deploy", "--playbok=x"], "No idea what '--playbok' is (did you mean '--playbook'?)"),
    (["--help", "tial-logs"], "no task is named 'tial-logs'. Did you mean 'tail-logs'? See"),
    (["plan", "--host", "sandbx", "--playbook", "job"], "Did you mean 'sandbox'?"),
    (["plan", "--host", "one", "--playbook", "jbo"], "Did you mean 'job'?"),
])
def test_a_typo_names_the_closest_task_flag_or_name(project: Path, args: list[str], said: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    (project / "hosts" / "sandbox.yaml").write_text("hostname: local\n")
    code, out, err = outrig(args, capsys)
    assert code == 2, err
    assert said in err and out == ""
    assert len(err.strip().splitlines()) == 1


def test_nothing_close_suggests_nothing(project: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    for args in (["xyzzy"], ["--zzzz"], ["status", "--zzzz"], ["plan", "--host", "qqqqqq"]):
        code, _, err = outrig(args, capsys)
        assert code == 2 and "did you mean" not in err.lower(), err


def test_a_repeatable_flag_may_come_twice_and_a_second_task_runs_nothing(
        project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = outrig(["plan", "--host", "one", "--host", "two", "--playbook", "job",
                             "--json"], capsys)
    assert code == 0, err
    code, out, err = outrig(["init", "--json", "status"], capsys)
    assert code == 2 and out == "" and not (project / "outrig.yaml").exists(), err


def test_version_after_a_task_is_answered_not_ignored(
        project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``plan -V`` planned (and said nothing of the version); -l and --help after a task
    are answered, so -V is too."""
    code, out, err = outrig(["plan", "--playbook", "job", "--host", "one", "-V"], capsys,
                            version="9.9")
    assert (code, out.strip(), err) == (0, "outrig 9.9", "")


def test_a_host_value_too_long_for_any_name_is_exit_2_not_a_traceback(
        project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for host in ("a" * 300, "root@" + "b" * 300 + ":22"):
        code, _, err = outrig(["status", "--host", host], capsys)
        assert code == 2 and "Traceback" not in err, err
        assert f"{len(host)} characters, longer than any host file name" in err


def test_inv_in_the_checkout_says_wrong_numbers_in_one_paragraph_with_exit_2() -> None:
    done = subprocess.run([sys.executable, "-m", "invoke", "--search-root", str(REPO), "status",
                           "--lines", "abc"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "--lines must be a whole number, not 'abc'" in done.stderr
    assert "Traceback" not in done.stderr


def test_completion_offers_host_and_playbook_names_of_the_project(
        project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = outrig(["--complete", "--", "outrig", "deploy", "--host"], capsys)
    assert code == 0 and out.split() == ["four", "one", "three", "two"]
    code, out, _ = outrig(["--complete", "--", "outrig", "plan", "--playbook", "jo"], capsys)
    assert code == 0 and out.split() == ["job"]
    code, out, _ = outrig(["--complete", "--", "outrig", "deploy", "--host", "--js"], capsys)
    assert "--json" in out.split() and "one" not in out.split()  # a flag: Invoke's own
    code, out, _ = outrig(["--complete", "--", "outrig", "dep"], capsys)
    assert "deploy" in out.split()  # task names: Invoke's own


def _product_strings(path: Path) -> list[tuple[int, str]]:
    """Every string literal in ``path`` that can reach a user (messages, help texts, schema
    descriptions): all string constants except docstrings, which explain the code."""
    import ast

    tree = ast.parse(path.read_text())
    docstrings: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                docstrings.add(id(first.value))
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in docstrings]


def test_no_product_message_tells_the_user_to_run_inv() -> None:
    """Hints name the installed command (`outrig status --host X`), on the workstation and in
    the box agent: `inv` only works inside a checkout of this repository, which docs/cli.md
    explains."""
    import re

    offenders = [f"{path.relative_to(REPO)}:{line}: {text.strip()[:80]}"
                 for path in [*sorted((REPO / "outrig").rglob("*.py")),
                              *sorted((REPO / "remote").rglob("*.py")), REPO / "tasks.py"]
                 for line, text in _product_strings(path)
                 if re.search(r"(^|[\s`(])inv [a-z-]+", text)]
    assert offenders == []


def test_exec_json_is_one_object_with_the_output_and_the_exit_status(
        project: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    write_host_file(project, "here", hostname="local", workdir=str(workdir),
                    env={"GREETING": "hi"})
    code, out, err = outrig(["exec", "--host", "here", "--json", "--", "sh", "-c",
                             'echo "$GREETING $(pwd)"; echo oops >&2; exit 3'], capsys)
    assert code == 3, err
    assert json.loads(out) == {"host": "here", "exit_code": 3, "stdout": f"hi {workdir}\n",
                               "stderr": "oops\n",
                               "command": ["sh", "-c",
                                           'echo "$GREETING $(pwd)"; echo oops >&2; exit 3']}


def test_ssh_json_prints_the_resolved_ssh_command_and_runs_nothing(
        project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_host_file(project, "far", hostname="127.0.0.1", port=2222, user="ubuntu",
                    workdir="/w", identity_file="/keys/id_far")
    code, out, err = outrig(["ssh", "--host", "far", "--json", "--", "htop"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    argv = doc["argv"]
    assert doc["host"] == "far" and argv[0] == "ssh"
    assert argv[argv.index("-p") + 1] == "2222" and argv[argv.index("-l") + 1] == "ubuntu"
    assert argv[argv.index("-i") + 1] == "/keys/id_far" and "-t" not in argv
    assert argv[argv.index("--") + 1] == "127.0.0.1" and argv[-1].endswith(" htop")
    code, _, err = outrig(["ssh", "--host", "one", "--json"], capsys)
    assert code == 2 and "'local'" in err  # a local host has nothing to ssh to


def test_init_json_lists_what_it_wrote(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = outrig(["init", "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["project"] == str(tmp_path)
    assert sorted(Path(p).relative_to(tmp_path).as_posix() for p in doc["wrote"]) == [
        "hosts/box.yaml", "outrig.yaml", "playbooks/hello.yaml"]


def test_every_task_takes_json() -> None:
    """`--json` everywhere: scripts never have to parse tables."""
    collection = make_collection()
    missing = [name for name in collection.task_names
               if "json" not in {a.name for a in collection[name].get_arguments()}]
    assert missing == []


@pytest.mark.parametrize(("playbooks", "named"), [(["hello"], "hello"),
                                                   (["a", "smoke"], "smoke"), ([], "NAME")])
def test_sandbox_up_suggests_a_playbook_the_project_has(tmp_path: Path, playbooks: list[str],
                                                        named: str) -> None:
    """`outrig init` makes hello.yaml, not this repository's smoke.yaml: the hint after
    sandbox-up names a playbook that deploys from that project."""
    from outrig.sandbox.service import describe_up

    (tmp_path / "hosts").mkdir()
    (tmp_path / "playbooks").mkdir()
    for name in playbooks:
        (tmp_path / "playbooks" / f"{name}.yaml").write_text("name: x\n")
    state = {"name": "sandbox", "sshd_port": 2222, "port": 2222,
             "host_file": str(tmp_path / "hosts" / "sandbox.yaml"), "log": "/l",
             "server": {"pid": 1}, "sshd": {"pid": 2}}
    lines = describe_up(state, "sandbox", down="outrig sandbox-down")
    assert f"           outrig deploy --host sandbox --playbook {named}" in lines, lines


def test_every_task_says_what_it_does_in_one_whole_line() -> None:
    """`outrig --list` shows each task's first docstring line: a whole sentence, never a
    fragment cut at the line break."""
    collection = make_collection()
    for name in collection.task_names:
        doc = (collection[name].__doc__ or "").strip()
        first = doc.splitlines()[0] if doc else ""
        assert first.endswith("."), (name, first)


@pytest.mark.parametrize("args", [["--help", "deploy"], ["--list"], ["--help"]])
def test_a_reader_that_goes_away_ends_the_output_without_a_traceback(args: list[str]) -> None:
    """``outrig --help deploy | head -1``: the pipe closes early; outrig exits 141 (128 +
    SIGPIPE) with nothing on stderr instead of a BrokenPipeError traceback. The same for the
    answers made before Invoke is imported (``--list``, ``--help``: outrig/cli/launcher.py)."""
    binary = Path(sys.executable).parent / "outrig"
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first byte
    with open(write_end, "wb") as stdout:
        proc = subprocess.run([str(binary), *args], stdout=stdout,
                              stderr=subprocess.PIPE, text=True, timeout=120)
    assert proc.returncode == 141, proc.stderr
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr


def _value_flags() -> list[tuple[str, str]]:
    """(task, --flag) for every flag of every task that takes a value."""
    return [(context.name, flag) for context in make_collection().to_contexts()
            for flag, arg in context.flags.items() if arg.takes_value]


@pytest.mark.parametrize(("task", "flag"), _value_flags())
def test_every_flag_given_without_its_value_is_refused(project: Path, task: str, flag: str,
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    """A repeatable flag (--host, --param, --spare) without its value was taken as given no
    times, and the default used (`outrig deploy --host` deployed to outrig.yaml's host)."""
    for args in ([task, flag], [task, flag, "--json"]):
        code, out, err = outrig(args, capsys)
        assert code == 2, (args, err)
        assert f"Flag {flag} needed value and was not given one" in err, (args, err)
        assert f"`outrig --help {task}`" in err and out == ""


def test_deploy_host_without_its_value_deploys_nothing_to_the_configured_host(
        project: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    workdir = tmp_path / "here-box"
    write_host_file(project, "here", hostname="local", workdir=str(workdir))
    (project / "outrig.yaml").write_text("host: here\nplaybook: job\n")
    for args in (["deploy", "--host"], ["deploy", "--param", "--host", "here"],
                 ["deploy", "--host", "--param", "n=2"]):
        code, _, err = outrig(args, capsys)
        assert code == 2 and "needed value" in err, (args, err)
    assert not workdir.exists(), "the agent ran on the configured host"
    assert Journal().runs() == []
    code, _, err = outrig(["deploy", "--host=here", "--param=n=2", "--dry-run"], capsys)
    assert code == 0, err  # the value in the same word is a value


def test_a_closed_pipe_ends_plan_quietly_with_141(project: Path) -> None:
    """`outrig plan | head -1`: rich's own handling exited 1; every write of outrig's ends
    with 141 (128 + SIGPIPE, as a shell reports a Unix tool ended by it), silently."""
    binary = Path(sys.executable).parent / "outrig"
    read_end, write_end = os.pipe()
    os.close(read_end)
    with open(write_end, "wb") as stdout:
        proc = subprocess.run([str(binary), "plan", "--host", "one", "--playbook", "job"],
                              stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=120,
                              cwd=project)
    assert proc.returncode == 141, proc.stderr
    assert "Traceback" not in proc.stderr and "Broken" not in proc.stderr


def test_ssh_quiets_the_client_only_when_it_runs_a_command(
        project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With a command, LogLevel=ERROR keeps OpenSSH's `Connection to ... closed.` (and its
    other notes) out of the command's output, and its errors in; an interactive shell keeps
    the client's messages."""
    from outrig.inventory import resolve_host
    from outrig.ops.shell import ssh_argv

    write_host_file(project, "far", hostname="127.0.0.1", port=2222, workdir="/w")
    host = resolve_host("far", hosts_dir=project / "hosts")
    for tty in (True, False):
        with_command = ssh_argv(host, ["htop"], tty=tty)
        assert "LogLevel=ERROR" in with_command[:with_command.index("--")], with_command
        assert "-q" not in with_command  # -q would hide a refused connection's error too
        shell = ssh_argv(host, [], tty=tty)
        assert "LogLevel=ERROR" not in shell, shell
    code, out, err = outrig(["ssh", "--host", "far", "--json", "--", "htop"], capsys)
    assert code == 0 and "LogLevel=ERROR" in json.loads(out)["argv"], err


def test_a_failure_to_connect_names_the_host_as_typed(
        project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The user typed `far`; the hint says `far`, and where it tried after it."""
    from tests.support.network import free_port

    port = free_port()  # nothing listens there
    write_host_file(project, "far", hostname="127.0.0.1", port=port, user="me", workdir="/w")
    code, _, err = outrig(["status", "--host", "far"], capsys)
    assert code == 1, err
    assert f"connection refused by far (me@127.0.0.1:{port})" in err, err


def test_a_fresh_init_refuses_to_contact_its_placeholder_host_naming_the_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`outrig init` then `outrig check` tried 203.0.113.10 for the whole connect timeout
    and blamed the link; `plan` and `deploy --dry-run` (which send nothing) still show what
    would run."""
    monkeypatch.chdir(tmp_path)
    for var in ("OUTRIG_HOST", "OUTRIG_PLAYBOOK", "OUTRIG_PROJECT"):
        monkeypatch.delenv(var, raising=False)
    assert outrig(["init"], capsys)[0] == 0
    for args in (["check"], ["status"], ["deploy"], ["exec", "--", "true"], ["ssh"],
                 ["tail-logs", "--no-follow"], ["cleanup", "--all"]):
        code, _, err = outrig(args, capsys)
        assert code == 2, (args, err)
        assert f"Edit {tmp_path / 'hosts' / 'box.yaml'}" in err and "placeholder" in err, err
        assert "link" not in err and "retrying" not in err, err
    for args in (["plan"], ["deploy", "--dry-run"]):  # these send nothing: they work
        code, _, err = outrig(args, capsys)
        assert code == 0, (args, err)


@pytest.mark.parametrize("key", ["OUTRIG_RUN", "OUTRIG_PROCESS", "OUTRIG_CGROUP_PROCS"])
def test_a_playbook_env_with_outrigs_own_marker_name_is_exit_2_naming_key_and_fix(
        project: Path, capsys: pytest.CaptureFixture[str], key: str) -> None:
    # the names outrig puts in every launched process: a playbook value would be overwritten,
    # or make a process look like another run's to cleanup
    (project / "playbooks" / "job.yaml").write_text(yaml.safe_dump({
        "name": "job", "processes": {"a": {"command": "echo", "gpus": [],
                                            "env": {key: "x", "VLLM_LOGGING_LEVEL": "DEBUG"}}}}))
    code, _, err = outrig(["plan", "--playbook", "job", "--host", "one"], capsys)
    assert code == 2, err
    assert f"processes.a.env.{key}: {key} is set by outrig in every process it launches" in err
    assert "remove it from env: (or give your variable another name)" in err
    assert "VLLM_LOGGING_LEVEL" not in err  # vLLM's own variables are the user's to set
