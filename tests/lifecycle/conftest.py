"""Fixtures of the agent's lifecycle tests (start-up, config read once, stop policy, readiness
server, node taint): a node's bin and conf dirs in a temp dir (testbed.agent_host)."""

from __future__ import annotations

import pathlib

import pytest

from testbed.agent_host import Node, make_node


@pytest.fixture
def node(tmp_path: pathlib.Path) -> Node:
    return make_node(tmp_path)
