"""The hostile tier's shared bed: the real agent process in a node netns of its own
(testbed/netns_agent.py), started and warmed once per module, stopped however the module ends."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from testbed.netns_agent import NetnsAgentBed


@pytest.fixture(scope="module")
def bed(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[NetnsAgentBed]:
    made = NetnsAgentBed(tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1]))
    made.start()
    try:
        made.warm()
        yield made
    finally:
        made.stop()
