"""Playbook loading: every bad input names the file, the key path and the line."""

from __future__ import annotations

from pathlib import Path

import pytest

from outrig.errors import ConfigError
from outrig.playbook import deep_merge, find_playbook, load_job

SMOKE = Path(__file__).resolve().parents[2] / "playbooks" / "smoke.yaml"


def write(tmp_path: Path, text: str, name: str = "p.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_shipped_smoke_playbook_loads_and_names_its_processes() -> None:
    job = load_job(SMOKE)
    assert job.name == "smoke"
    assert list(job.spec.processes) == ["server", "trainer"]
    assert job.spec.processes["trainer"].after_names() == ["server"]
    assert job.files[0].remote == "train.py" and job.files[0].local.is_file()


def test_test_overrides_are_merged_only_with_test_flag() -> None:
    assert load_job(SMOKE).spec.params["steps"] == 400
    assert load_job(SMOKE, test=True).spec.params["steps"] == 5


def test_test_flag_without_test_section_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, "processes:\n  a:\n    command: echo hi\n")
    with pytest.raises(ConfigError, match="no 'test:' section"):
        load_job(path, test=True)


def test_malformed_yaml_reports_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, "processes:\n  a:\n    command: [echo, hi\n    env: {}\n")
    with pytest.raises(ConfigError) as info:
        load_job(path)
    message = str(info.value)
    assert "p.yaml:" in message and "malformed YAML" in message
    assert ":4" in message or ":5" in message


def test_unknown_key_is_an_error_with_its_line(tmp_path: Path) -> None:
    path = write(tmp_path, "processes:\n  a:\n    command: echo hi\n    gpu: [0]\n")
    with pytest.raises(ConfigError) as info:
        load_job(path)
    assert "p.yaml:4: processes.a.gpu: unknown key" in str(info.value)


def test_unknown_top_level_key_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, "proceses:\n  a:\n    command: echo\n")
    with pytest.raises(ConfigError) as info:
        load_job(path)
    text = str(info.value)
    assert "p.yaml:1: proceses: unknown key" in text
    assert "processes: required key is missing" in text


def test_wrong_type_names_key_path(tmp_path: Path) -> None:
    path = write(tmp_path, "processes:\n  a:\n    command: echo\n    gpus: [zero]\n")
    with pytest.raises(ConfigError) as info:
        load_job(path)
    assert "p.yaml:4: processes.a.gpus[0]" in str(info.value)


def test_bad_regex_in_fatal_is_rejected(tmp_path: Path) -> None:
    path = write(tmp_path, "processes:\n  a:\n    command: echo\n    fatal: ['(unclosed']\n")
    with pytest.raises(ConfigError, match="does not compile"):
        load_job(path)


def test_remote_file_path_must_stay_in_workdir(tmp_path: Path) -> None:
    (tmp_path / "x.py").write_text("")
    path = write(tmp_path, "processes:\n  a:\n    command: echo\nfiles:\n  ../x.py: x.py\n")
    with pytest.raises(ConfigError, match="stay inside it"):
        load_job(path)


def test_missing_local_file_is_named(tmp_path: Path) -> None:
    path = write(tmp_path, "processes:\n  a:\n    command: echo\nfiles:\n  x.py: nope.py\n")
    with pytest.raises(ConfigError, match=r"files\.x\.py: local file .*nope\.py does not exist"):
        load_job(path)


def test_duplicate_gpu_in_one_process_is_rejected(tmp_path: Path) -> None:
    path = write(tmp_path, "processes:\n  a:\n    command: echo\n    gpus: [1, 1]\n")
    with pytest.raises(ConfigError, match="names a GPU twice"):
        load_job(path)


def test_process_names_must_be_file_safe(tmp_path: Path) -> None:
    path = write(tmp_path, "processes:\n  ../evil:\n    command: echo\n")
    with pytest.raises(ConfigError, match="must start with a letter"):
        load_job(path)


@pytest.mark.parametrize("given", ["folder", "./folder", "sub/x.yaml", "x"])
def test_a_playbook_that_is_a_folder_is_called_a_folder(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        given: str) -> None:
    """It said "playbook file folder does not exist" of a folder that exists (issue 40)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "folder").mkdir()
    (tmp_path / "sub" / "x.yaml").mkdir(parents=True)
    playbooks = tmp_path / "playbooks"
    (playbooks / "x.yaml").mkdir(parents=True)
    with pytest.raises(ConfigError, match="is a folder, not a playbook file") as caught:
        find_playbook(given, playbooks)
    assert "does not exist" not in str(caught.value)


def test_find_playbook_lists_known_ones(tmp_path: Path) -> None:
    (tmp_path / "one.yaml").write_text("")
    with pytest.raises(ConfigError, match="Known playbooks: one"):
        find_playbook("two", tmp_path)
    assert find_playbook("one", tmp_path) == tmp_path / "one.yaml"


def test_deep_merge_merges_mappings_and_replaces_lists() -> None:
    base = {"a": {"b": 1, "c": [1, 2]}, "d": 1}
    merged = deep_merge(base, {"a": {"c": [3]}, "e": 2})
    assert merged == {"a": {"b": 1, "c": [3]}, "d": 1, "e": 2}
    assert base["a"]["c"] == [1, 2]


def test_duplicate_process_key_names_file_line_and_key(tmp_path: Path) -> None:
    path = write(tmp_path, "processes:\n  a:\n    command: echo one\n  b:\n    command: x\n"
                           "  a:\n    command: echo two\n")
    with pytest.raises(ConfigError) as info:
        load_job(path)
    text = str(info.value)
    assert "p.yaml:6: processes.a is given twice" in text and "first at line 2" in text


def test_duplicate_key_in_any_mapping_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, "processes:\n  a:\n    command: echo\n    env:\n      X: '1'\n"
                           "      X: '2'\n")
    with pytest.raises(ConfigError, match=r"p.yaml:6: processes.a.env.X is given twice"):
        load_job(path)


@pytest.mark.parametrize(("text", "key", "fix"), [
    ("name: ../evil\nprocesses:\n  a: {command: echo}\n", "p.yaml:1: name",
     "letters, digits, '.', '_' and '-'"),
    ("processes:\n  a:\n    command: echo\n    env: {A=B: x}\n", "p.yaml:4: processes.a.env",
     "'A=B' is not an environment variable name"),
    ("processes:\n  a:\n    command: echo\n    ready: {http: '127.0.0.1:8000/health'}\n",
     "p.yaml:4: processes.a.ready.http", "e.g. 'http://127.0.0.1:8000/health'"),
])
def test_values_the_box_would_refuse_are_refused_at_plan_time(
        tmp_path: Path, text: str, key: str, fix: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_job(write(tmp_path, text))
    assert key in str(info.value) and fix in str(info.value), str(info.value)


def test_templated_ready_url_is_left_to_the_planner(tmp_path: Path) -> None:
    job = load_job(write(tmp_path, "params: {url: 'http://127.0.0.1:1/'}\nprocesses:\n"
                                   "  a: {command: echo, ready: {http: '${url}'}}\n"))
    assert job.spec.processes["a"].ready is not None


def test_file_stem_that_cannot_name_a_playbook_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "processes:\n  a: {command: echo}\n", name="my job.yaml")
    with pytest.raises(ConfigError, match="add name:"):
        load_job(path)


def test_ready_generate_without_model_names_the_key_and_the_fix(tmp_path: Path) -> None:
    path = write(tmp_path, "processes:\n  a:\n    command: echo hi\n    ready:\n"
                 "      http: http://127.0.0.1:8000/health\n      generate: true\n")
    with pytest.raises(ConfigError) as info:
        load_job(path)
    text = str(info.value)
    assert "p.yaml:" in text and "processes.a.ready" in text
    assert "generate: true needs http and model" in text


def test_ready_generate_reaches_the_plan(tmp_path: Path) -> None:
    path = write(tmp_path, "processes:\n  a:\n    command: echo hi\n    ready:\n"
                 "      http: http://127.0.0.1:8000/health\n      model: m\n"
                 "      generate: true\n")
    assert load_job(path).spec.processes["a"].ready.generate is True  # type: ignore[union-attr]


def test_a_playbook_is_found_by_its_file_name_its_path_or_its_name(tmp_path: Path) -> None:
    """``playbooks/a.yaml`` with ``name: b``: every spelling means the runs filed as b;
    a name no file has is kept (a run deployed from another checkout)."""
    from outrig.playbook import resolve_playbook

    (tmp_path / "a.yaml").write_text("name: b\nprocesses: {p: {command: [x]}}\n")
    (tmp_path / "plain.yaml").write_text("processes: {p: {command: [x]}}\n")
    for given in ("a", "b", str(tmp_path / "a.yaml")):
        ref = resolve_playbook(given, tmp_path)
        assert (ref.name, ref.path) == ("b", tmp_path / "a.yaml"), given
    assert find_playbook("b", tmp_path) == tmp_path / "a.yaml"
    assert load_job(find_playbook("b", tmp_path)).name == "b"
    assert resolve_playbook("plain", tmp_path).name == "plain"
    elsewhere = resolve_playbook("elsewhere", tmp_path)
    assert (elsewhere.name, elsewhere.path) == ("elsewhere", None)
    with pytest.raises(ConfigError, match="unknown playbook 'elsewhere'"):
        find_playbook("elsewhere", tmp_path)


def test_two_files_with_one_name_are_refused_naming_both(tmp_path: Path) -> None:
    from outrig.playbook import resolve_playbook

    for stem in ("one", "two"):
        (tmp_path / f"{stem}.yaml").write_text("name: same\nprocesses: {p: {command: [x]}}\n")
    with pytest.raises(ConfigError, match="one.yaml, two.yaml"):
        resolve_playbook("same", tmp_path)
