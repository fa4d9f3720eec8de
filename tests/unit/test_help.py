"""The help and the prose outrig wraps itself, at 80 columns (``COLUMNS=80``): ``outrig
--help TASK`` as a finished tool's help (usage, the docstring as its description, options
with value names), ``outrig --help`` with outrig's own options only, ``outrig --list``, and
error paragraphs and notes wrapped at spaces, never inside a word."""

from __future__ import annotations

import io
import re

import pytest

from outrig.cli import make_collection
from outrig.cli.flags import friendly
from outrig.cli.helptext import Option, description_lines, option_lines, value_name
from outrig.console import Reporter
from outrig.errors import ConfigError
from tests.support.cli import outrig

TASKS = sorted(make_collection().task_names)
RUNNER_FLAGS = ["--hide", "--pty", "--echo", "--dry", "--warn-only", "--command-timeout",
                "--prompt-for-sudo-password", "--write-pyc", "--config", "--debug",
                "--list-depth", "--list-format"]


@pytest.fixture(autouse=True)
def eighty(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")


def words(text: str) -> set[str]:
    return set(text.split())


def sources(task: str) -> str:
    """Everything the help of ``task`` is made of: its docstring and its flags' help."""
    collection = make_collection()
    found = collection[task]
    kept = found.__dict__.get("_outrig_help", found.help)
    return (found.__doc__ or "").replace("``", "`") + " " + " ".join(kept.values())


def assert_fits(text: str, width: int = 80) -> None:
    wide = [line for line in text.splitlines() if len(line) > width]
    assert not wide, wide


def test_deploy_help_reads_like_a_finished_tools_help(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = outrig(["--help", "deploy"], capsys)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "Usage: outrig deploy [options]"
    assert lines[2].startswith("Push files, stop the previous run")
    for leftover in ("Docstring:", "--core-opts", "other tasks here", "=STRING"):
        assert leftover not in out
    for spec in ("--max-parallel N", "--host HOST", "--playbook NAME", "--param KEY=VALUE",
                 "--deadline SECONDS", "--project DIR"):
        assert re.search(rf"^  {re.escape(spec)}  ", out, re.M), spec
    host_row = out[out.index("  --host HOST"):out.index("  --playbook NAME")]
    assert "(repeatable)" in host_row
    # each flag's own help is there (a second parser once left every flag without it)
    assert re.search(r"^  --dry-run +print the plan and stop; nothing is sent$", out, re.M)
    assert "    outrig deploy --playbook smoke --param steps=50 --dry-run" not in out
    assert "  outrig deploy --playbook smoke --param steps=50 --dry-run" in out


def test_value_names_come_from_the_table_else_from_the_flag() -> None:
    assert value_name("lines") == "N" and value_name("deadline") == "SECONDS"
    assert value_name("run") == "RUN" and value_name("some-thing") == "SOME_THING"
    assert value_name("count", "int") == "N"
    assert Option(("help", "h"), takes_value=True, optional=True).spec == "-h, --help [TASK]"
    assert Option(("color",), inverse=True).spec == "--[no-]color"


@pytest.mark.parametrize("task", TASKS)
def test_every_task_help_fits_80_columns_and_splits_no_word(
        task: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = outrig(["--help", task], capsys)
    assert code == 0 and out.startswith(f"Usage: outrig {task} [options]")
    assert_fits(out)
    assert "Docstring:" not in out and "STRING" not in out
    missing = words(sources(task)) - words(out)
    assert not missing, missing  # a word cut in two (or dropped) is missing whole


def test_status_and_tail_logs_name_the_lines_value(capsys: pytest.CaptureFixture[str]) -> None:
    for task in ("status", "tail-logs"):
        _, out, _ = outrig(["--help", task], capsys)
        assert re.search(r"^  --lines N  ", out, re.M), out


@pytest.mark.parametrize("args", [["--help"], []])
def test_core_help_shows_outrigs_own_options_only(args: list[str],
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = outrig(args, capsys)
    assert code == 0 and out.startswith("Usage: outrig TASK [options]")
    for flag in ("-V, --version", "-h, --help [TASK]", "-l, --list", "--complete",
                 "--print-completion-script SHELL"):
        assert f"  {flag}" in out, flag
    for flag in RUNNER_FLAGS:
        assert flag not in out, flag
    assert "  deploy " in out and "  tail-logs " in out
    assert_fits(out)


@pytest.mark.parametrize("flag", RUNNER_FLAGS)
def test_invokes_shell_runner_flags_are_refused_as_unknown(
        flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    takes_value = flag in ("--hide", "--command-timeout", "--config", "--list-depth",
                           "--list-format")
    code, out, err = outrig([flag, *(["x"] if takes_value else []), "--list"], capsys)
    assert code == 2, (out, err)
    assert f"No idea what '{flag}' is" in err and out == ""


def test_list_shows_every_task_with_its_summary_wrapped(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = outrig(["--list"], capsys)
    assert code == 0 and out.startswith("Tasks:")
    assert_fits(out)
    collection = make_collection()
    for task in TASKS:
        summary = (collection[task].__doc__ or "").strip().splitlines()[0]
        assert re.search(rf"^  {re.escape(task)} ", out, re.M), task
        assert words(summary) <= words(out), task


def test_help_of_no_such_task_is_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = outrig(["--help", "nosuch"], capsys)
    assert code == 2 and "no task is named 'nosuch'" in err


def test_an_error_paragraph_is_wrapped_at_spaces_to_the_terminal(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    message = ("playbook smoke has no current run on sandbox; start one with outrig deploy "
               "--host sandbox --playbook smoke, or name one with --run RUN (see "
               "~/.local/state/outrig/runs/a-rather-long-folder-name/journal.jsonl)")

    @friendly
    def failing() -> None:
        raise ConfigError(message)

    monkeypatch.setenv("COLUMNS", "50")
    with pytest.raises(BaseException):  # noqa: B017 - Invoke's Exit
        failing()
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) > 3 and lines[0].startswith("error: playbook smoke")
    assert all(line.startswith("  ") for line in lines[1:])
    assert all(len(line) <= 50 for line in lines if " " in line.strip()), lines
    assert words(err) == words("error: " + message)


def test_an_error_is_left_on_one_line_when_nothing_says_a_width(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Not a terminal and no COLUMNS (a log, a pipe, grep): the paragraph stays one line."""
    monkeypatch.delenv("COLUMNS")

    @friendly
    def failing() -> None:
        raise ConfigError("word " * 40)

    with pytest.raises(BaseException):  # noqa: B017 - Invoke's Exit
        failing()
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_a_parse_error_is_wrapped_too(monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COLUMNS", "60")
    code, _, err = outrig(["deploy", "--host"], capsys)
    assert code == 2 and len(err.splitlines()) > 1
    assert_fits(err, 60)
    assert "`outrig --help deploy`" in err.replace("\n  ", " ")


def test_notes_warnings_and_checks_are_wrapped_but_a_process_line_is_not(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "50")
    err = io.StringIO()
    reporter = Reporter(err=err, out=io.StringIO())
    long = "the box's clock is 12 s ahead of this workstation's; log times may look shifted"
    reporter.warn(long)
    reporter.success("uk-node: reached in 0.2 s, python 3.11, 8× NVIDIA H200, 1.2 TB free")
    reporter.info(long)
    line = "x" * 30 + " " + "y" * 30
    reporter.event({"event": "output", "line": line})
    text = err.getvalue()
    lines = text.splitlines()
    assert lines[0].startswith("warning: the box's clock") and lines[1].startswith("  ")
    assert any(ln.startswith("✓ uk-node:") for ln in lines)
    assert all(len(ln) <= 50 for ln in lines if ln != line), lines
    assert line in lines  # a process's own line as it came
    assert words(text) == words(f"warning: {long} ✓ uk-node: reached in 0.2 s, python 3.11, "
                                f"8× NVIDIA H200, 1.2 TB free {long} {line}")


def test_an_option_too_wide_for_the_column_has_its_help_under_it() -> None:
    lines = option_lines([Option(("print-completion-script",), "print it", takes_value=True),
                          Option(("json",), "print JSON")], 80)
    assert lines[0] == "  --print-completion-script SHELL"
    assert lines[1].strip() == "print it" and lines[2].startswith("  --json ")


def test_a_long_example_breaks_before_a_flag() -> None:
    doc = ("Do it.\n\nExamples:\n    outrig tail-logs --host uk-node --process trainer "
           "--lines 100 --grep global_step\n")
    lines = description_lines(doc, 80)
    assert lines[3] == "  outrig tail-logs --host uk-node --process trainer --lines 100"
    assert lines[4] == "      --grep global_step"
