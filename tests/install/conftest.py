"""Fixtures of the installer tests: a node's CNI dirs in a temp dir (testbed.agent_host)."""

from __future__ import annotations

import pathlib

import pytest

from testbed.agent_host import Node, make_node
from tests.conformance_data import CONFORMANCE_DIR


def conformance_dir() -> pathlib.Path:
    """The project's copy of Istio's conformance cases (tests/conformance_data.py)."""
    if not (CONFORMANCE_DIR / "install" / "cases.json").is_file():
        pytest.fail(f"conformance data not found at {CONFORMANCE_DIR}")
    return CONFORMANCE_DIR


@pytest.fixture
def node(tmp_path: pathlib.Path) -> Node:
    return make_node(tmp_path)
