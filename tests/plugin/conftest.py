"""Fixtures of the plugin tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.plugin.helpers import AgentTestDouble


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[AgentTestDouble]:
    """The agent test double listening in its own run dir under tmp_path."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    double = AgentTestDouble(run_dir)
    try:
        yield double
    finally:
        double.close()
