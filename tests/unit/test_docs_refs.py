"""The docs name only what exists: links resolve, repository paths are in the repository, and
docs/playbooks.md documents every key of the playbook schema.

Paths under ``hosts/`` and ``playbooks/`` in the docs are the reader's own files (examples),
so only the tool's own folders are checked.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import BaseModel

from outrig.formats.environments import EnvironmentSpec, RequiresSpec
from outrig.playbook import (
    CheckpointsSpec,
    ParallelSpec,
    PlaybookSpec,
    ProcessSpec,
    ReadySpec,
    StageItemSpec,
    StopSpec,
)

REPO = Path(__file__).resolve().parents[2]
DOCS = [*sorted((REPO / "docs").glob("*.md")), REPO / "README.md"]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
# A path into the tool's own folders; "outrig/_box/" exists only in an installed wheel.
REPO_PATH = re.compile(r"(?<![\w./<~-])((?:docs|outrig|remote|tests|shared|bench)/"
                       r"[\w./-]*\w)")
INSTALLED_ONLY = ("outrig/_box/",)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_links_and_repository_paths_exist(doc: Path) -> None:
    text = doc.read_text()
    missing = [target for target in LINK.findall(text)
               if "://" not in target and not (doc.parent / target).exists()]
    missing += [path for path in REPO_PATH.findall(text)
                if not path.startswith(INSTALLED_ONLY) and not (REPO / path).exists()]
    assert missing == [], f"{doc.name} names files that are not in the repository: {missing}"


def documented_keys(text: str) -> set[str]:
    """The first cell of every table row that is a key in backticks."""
    return set(re.findall(r"^\|\s*`([\w.]+)`\s*\|", text, re.MULTILINE))


@pytest.mark.parametrize("model", [PlaybookSpec, ProcessSpec, ReadySpec, StopSpec,
                                   ParallelSpec, CheckpointsSpec, StageItemSpec,
                                   EnvironmentSpec, RequiresSpec], ids=lambda m: m.__name__)
def test_playbooks_doc_has_every_key_of_the_schema(model: type[BaseModel]) -> None:
    keys = documented_keys((REPO / "docs" / "playbooks.md").read_text())
    assert set(model.model_fields) - keys == set(), \
        f"docs/playbooks.md has no table row for these keys of {model.__name__}"
