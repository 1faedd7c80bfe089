"""Fixtures of the pod server tests (helpers live in tests/podserver/helpers.py)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from tests.podserver.helpers import (
    HandlerRig,
    InMemoryPods,
    ScriptedRedirector,
    build_rig,
    make_pod,
)


@pytest.fixture
def rig() -> HandlerRig:
    return build_rig(InMemoryPods(make_pod()), ScriptedRedirector())


@pytest.fixture
def agent_log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    caplog.set_level(logging.DEBUG)
    yield caplog
