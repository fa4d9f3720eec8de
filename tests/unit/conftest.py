"""The ``box`` fixture: the agent run locally on a fresh workdir (tests/support/agent.py's
:class:`Box`), shared by the agent's unit tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from outrig.transport import register
from tests.support.agent import Box


@pytest.fixture
def box(tmp_path: Path) -> Iterator[Box]:
    b = Box(tmp_path)
    try:
        yield b
    finally:
        b.teardown()


# The replay connector (tests/support/replay.py) serves hosts with ``hostname: replay:FILE``.
register("replay", "tests.support.replay:ReplayConnector")
