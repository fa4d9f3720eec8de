"""The move record and the redeploy rebuilt from it (outrig/redeploy/): pure, no box.

A deploy's record keeps the playbook as deployed, its params, --test and the box's address;
the rebuild uses them, not today's file, and names each difference."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from outrig.errors import ConfigError
from outrig.inventory import HostBook, resolve_host
from outrig.journal import Journal
from outrig.playbook import find_playbook, load_job
from outrig.redeploy.rebuild import rebuild, redeploy_of
from outrig.redeploy.record import RECORD_KEY, move_record, recorded_host, run_host
from tests.support.hosts import write_host_file

BOOK = {"name": "job", "params": {"steps": 400, "tag": "file"},
        "secrets": ["HF_TOKEN"],
        "processes": {"trainer": {"command": "python3 t.py --steps ${steps} --tag ${tag}",
                                  "gpus": []}},
        "test": {"params": {"steps": 5}}}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "playbooks").mkdir()
    (tmp_path / "hosts").mkdir()
    (tmp_path / "playbooks" / "job.yaml").write_text(yaml.safe_dump(BOOK, sort_keys=False))
    write_host_file(tmp_path, "a", hostname="127.0.0.1", port=2222, user="root", workdir="/w",
                    identity_file="~/.ssh/id_a", env={"PATH": "/opt/bin:$PATH", "HF_TOKEN": "x"})
    return tmp_path


def deployed(project: Path, params: dict[str, Any], test: bool = False) -> dict[str, Any]:
    """A journal run record as deploy_on writes it."""
    job = load_job(find_playbook("job", project / "playbooks"), test=test, params=params)
    host = resolve_host("a", hosts_dir=project / "hosts")
    return {"run_id": "job-1", "host": "a", "playbook": "job", "param_overrides": params,
            "test_mode": test, RECORD_KEY: move_record(job, host, params)}


def argv(job: Any) -> str:
    return str(job.spec.processes["trainer"].command)


def test_the_record_keeps_the_address_and_no_secret(project: Path) -> None:
    record = deployed(project, {"steps": 3000})
    host = recorded_host(record)
    assert host is not None
    assert (host.hostname, host.port, host.user, host.workdir, host.identity_file) == \
        ("127.0.0.1", 2222, "root", "/w", "~/.ssh/id_a")
    assert host.env == {"PATH": "/opt/bin:$PATH"}, "an env entry named as a secret is left out"
    assert "x" not in str(record[RECORD_KEY]["host"])


def test_a_rebuild_is_the_job_as_deployed_with_its_params(project: Path) -> None:
    record = deployed(project, {"steps": 3000}, test=True)
    book = project / "playbooks" / "job.yaml"
    book.write_text(book.read_text().replace("t.py", "edited.py"))
    again = rebuild(project / "playbooks", record)
    assert again.params == {"steps": 3000} and again.test
    assert again.job.spec.params["steps"] == 3000 and "edited" not in argv(again.job)
    assert any("changed since run job-1" in n for n in again.notes), again.notes
    given = rebuild(project / "playbooks", record, params={"steps": 10, "tag": "new"})
    assert given.job.spec.params == {"steps": 10, "tag": "new"}
    assert "--param steps=10 given on the command line wins over the run's steps=3000" in \
        given.notes
    book.unlink()
    gone = rebuild(project / "playbooks", record)
    assert any("is gone" in n for n in gone.notes) and gone.job.spec.params["steps"] == 3000


def test_a_playbook_named_again_is_todays_file_with_the_runs_params(project: Path) -> None:
    """`migrate --playbook job`: the file as it is now (the user asked for it), with the
    run's params and test mode, and a note that it is not the playbook as deployed."""
    record = deployed(project, {"steps": 3000})
    book = project / "playbooks" / "job.yaml"
    book.write_text(book.read_text().replace("t.py", "edited.py"))
    again = rebuild(project / "playbooks", record, named="job")
    assert "edited" in argv(again.job) and again.job.spec.params["steps"] == 3000
    assert any("not run job-1's playbook as deployed" in n for n in again.notes), again.notes


def test_a_run_without_a_move_record_uses_todays_file_with_its_params(project: Path) -> None:
    record = {"run_id": "old-1", "playbook": "job", "param_overrides": {"tag": "kept"}}
    again = rebuild(project / "playbooks", record)
    assert again.job.spec.params["tag"] == "kept"
    assert "has no record of its playbook as deployed" in again.notes[0]


def test_a_boxs_address_outlives_its_host_file(project: Path, tmp_path: Path) -> None:
    journal = Journal(tmp_path / "state")
    journal.record_run("job-1", deployed(project, {}))
    (project / "hosts" / "a.yaml").unlink()
    host, note = run_host(HostBook(project / "hosts"), journal, "a", "job-1")
    assert host.port == 2222 and note is not None and "no host file any more" in note
    with pytest.raises(ConfigError, match="unknown host 'b'"):
        run_host(HostBook(project / "hosts"), journal, "b", "job-1")
    assert redeploy_of(project / "playbooks", journal, "job-1", "job").job.name == "job"
