"""The not-ready taint remover on its own: the patch it sends, waiting for readiness, retries
with backoff, never blocking. An in-memory node stands in for the API server here;
test_node_taint_cluster.py runs the same against the real kube-apiserver."""

from __future__ import annotations

import copy
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from agent.config import Settings
from agent.kube import KubeClients
from agent.node_taint import (
    TAINT_KEY,
    NodeTaintRemover,
    TaintTiming,
    removal_patch,
    without_key,
)
from agent.wiring import build_services
from testbed.wait import wait_for

FAST = TaintTiming(ready_poll_seconds=0.01, initial_backoff_seconds=0.01, max_backoff_seconds=0.05)
OURS = {"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"}
OTHER = {"key": "example.com/maintenance", "effect": "NoSchedule"}


@dataclass
class _Response:
    data: bytes


@dataclass
class FakeCore:
    """read_node / patch_node over one node's taints, applying JSON patches' test/replace."""

    taints: list[dict[str, Any]]
    failures: list[ApiException] = field(default_factory=list)
    """Raised, in order, by the next read_node calls."""
    reads: int = 0
    patches: list[tuple[str, Any, str | None]] = field(default_factory=list)
    before_patch: Callable[[], None] | None = None

    def read_node(self, name: str, **_: Any) -> _Response:
        self.reads += 1
        if self.failures:
            raise self.failures.pop(0)
        return _Response(
            json.dumps({"metadata": {"name": name}, "spec": {"taints": self.taints}}).encode()
        )

    def patch_node(
        self, name: str, body: Any, *, _content_type: str | None = None, **_: Any
    ) -> _Response:
        self.patches.append((name, copy.deepcopy(body), _content_type))
        if self.before_patch is not None:
            hook, self.before_patch = self.before_patch, None
            hook()
        for op in body:
            if op["op"] == "test" and op["value"] != self.taints:
                raise ApiException(status=422, reason="Unprocessable Entity")
            if op["op"] == "replace":
                self.taints = copy.deepcopy(op["value"])
        return _Response(b"{}")


@pytest.fixture
def run() -> Iterator[Callable[..., NodeTaintRemover]]:
    started: list[NodeTaintRemover] = []

    def start(
        core: FakeCore, ready: Callable[[], bool] = lambda: True, timing: TaintTiming = FAST
    ) -> NodeTaintRemover:
        remover = NodeTaintRemover(core, "node-1", is_ready=ready, timing=timing)
        remover.start()
        started.append(remover)
        return remover

    yield start
    for remover in started:
        remover.stop()


def test_patch_tests_the_list_read_and_replaces_it() -> None:
    ours_execute = {**OURS, "effect": "NoExecute"}
    taints = [OURS, OTHER, ours_execute]
    assert removal_patch(taints, TAINT_KEY) == [
        {"op": "test", "path": "/spec/taints", "value": taints},
        {"op": "replace", "path": "/spec/taints", "value": [OTHER]},
    ]
    assert removal_patch([OTHER], TAINT_KEY) is None
    assert removal_patch([], TAINT_KEY) is None
    assert without_key([OURS], TAINT_KEY) == []


def test_removes_every_effect_keeps_the_rest(
    run: Callable[..., NodeTaintRemover], caplog: pytest.LogCaptureFixture
) -> None:
    core = FakeCore([OURS, OTHER, {**OURS, "effect": "NoExecute"}])
    with caplog.at_level(logging.INFO, logger="agent.node_taint"):
        remover = run(core)
        assert remover.done.wait(5)
    assert core.taints == [OTHER]
    assert core.patches[0][2] == "application/json-patch+json"
    record = next(r for r in caplog.records if "removed the not-ready taint" in r.message)
    assert record.fields == {  # type: ignore[attr-defined]
        "node": "node-1",
        "taint": TAINT_KEY,
        "effects": "NoSchedule,NoExecute",
    }


def test_missing_taint_is_success_without_a_write(run: Callable[..., NodeTaintRemover]) -> None:
    core = FakeCore([OTHER])
    remover = run(core)
    assert remover.done.wait(5)
    assert core.patches == [] and core.taints == [OTHER]


def test_waits_for_readiness(run: Callable[..., NodeTaintRemover]) -> None:
    ready = threading.Event()
    core = FakeCore([OURS])
    remover = run(core, ready=ready.is_set)
    time.sleep(0.2)  # the check itself: nothing may happen while not ready
    assert core.reads == 0 and core.taints == [OURS]  # not ready: the node is not even read
    ready.set()
    assert remover.done.wait(5)
    assert core.taints == []


def test_checks_again_after_readiness_was_lost(run: Callable[..., NodeTaintRemover]) -> None:
    ready = threading.Event()
    ready.set()
    core = FakeCore([OURS])
    remover = run(core, ready=ready.is_set)
    assert remover.done.wait(5)
    ready.clear()
    assert wait_for(lambda: not remover.done.is_set())
    core.taints = [OURS]  # tainted again meanwhile (a node that went away and came back)
    ready.set()
    assert remover.done.wait(5)
    assert core.taints == []


def test_concurrent_change_is_kept(run: Callable[..., NodeTaintRemover]) -> None:
    core = FakeCore([OURS])
    added = {"key": "example.com/added-meanwhile", "effect": "NoExecute"}
    core.before_patch = lambda: core.taints.append(added)
    remover = run(core)
    assert remover.done.wait(5)
    assert core.taints == [added]
    assert remover.attempts == 2 and len(core.patches) == 2


@pytest.mark.parametrize("status", [500, 403, 404, 429])
def test_api_errors_are_retried_with_backoff(
    run: Callable[..., NodeTaintRemover], status: int, caplog: pytest.LogCaptureFixture
) -> None:
    core = FakeCore([OURS], failures=[ApiException(status=status, reason="nope")] * 3)
    with caplog.at_level(logging.WARNING, logger="agent.node_taint"):
        remover = run(core)
        assert remover.done.wait(5)
    assert core.taints == [] and remover.attempts == 4
    waits = [
        r.fields["retry_in_seconds"]  # type: ignore[attr-defined]
        for r in caplog.records
        if "retrying" in r.message
    ]
    assert len(waits) == 3
    assert all(
        f"HTTP {status}" in r.fields["error"]  # type: ignore[attr-defined]
        for r in caplog.records
        if "retrying" in r.message
    )


def test_backoff_doubles_up_to_the_cap() -> None:
    timing = TaintTiming(
        ready_poll_seconds=0.01, initial_backoff_seconds=1.0, max_backoff_seconds=4.0
    )
    core = FakeCore([OURS], failures=[ApiException(status=503)] * 100)
    remover = NodeTaintRemover(core, "node-1", is_ready=lambda: True, timing=timing)
    waits: list[float] = []

    class Stop:
        def is_set(self) -> bool:
            return len(waits) >= 5

        def wait(self, seconds: float) -> bool:
            waits.append(seconds)
            return self.is_set()

    assert remover._remove_until_done(Stop()) is False
    for got, base in zip(waits, [1.0, 2.0, 4.0, 4.0, 4.0], strict=True):
        assert 0.8 * base <= got <= 1.2 * base


def test_stop_does_not_wait_for_the_backoff(run: Callable[..., NodeTaintRemover]) -> None:
    slow = TaintTiming(ready_poll_seconds=0.01, initial_backoff_seconds=60.0)
    core = FakeCore([OURS], failures=[ApiException(status=500)] * 10)
    remover = run(core, timing=slow)
    assert wait_for(lambda: core.reads == 1)
    started = time.monotonic()
    remover.stop()
    assert time.monotonic() - started < 2.0
    assert core.taints == [OURS]


def test_connection_errors_and_a_raising_check_are_survived(
    run: Callable[..., NodeTaintRemover],
) -> None:
    calls = {"n": 0}

    def flaky_ready() -> bool:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("broken check")
        return True

    core = FakeCore([OURS])
    original = core.read_node
    errors = [ConnectionRefusedError("refused")]

    def read_node(name: str, **kw: Any) -> _Response:
        if errors:
            raise errors.pop()
        return original(name, **kw)

    core.read_node = read_node  # type: ignore[method-assign]
    remover = run(core, ready=flaky_ready)
    assert remover.done.wait(5)
    assert core.taints == []


def _clients() -> KubeClients:
    return KubeClients(api=None, core=FakeCore([OURS]), apps=None)


@pytest.mark.parametrize("enabled", [False, True])
def test_service_exists_only_when_enabled(enabled: bool, tmp_path: Any) -> None:
    from agent.install.installer import Installer

    settings = Settings(
        removeNotReadyTaint=enabled,
        mountedCniConfDir=str(tmp_path),
        mountedCniBinDir=str(tmp_path),
        pluginSourceDir=str(tmp_path),
        cniAgentRunDir=str(tmp_path / "run"),
    )
    installer = Installer(settings, pod_name="p", pod_namespace="n")
    services = build_services(
        settings,
        installer,
        node_name="node-1",
        clients=_clients(),
    ).services
    removers = [s for s in services if isinstance(s, NodeTaintRemover)]
    assert len(removers) == (1 if enabled else 0)
    if enabled:
        assert removers[0].node_name == "node-1"
        assert not hasattr(removers[0], "ready"), "it must not gate /readyz itself"
