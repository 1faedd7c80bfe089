"""The pod socket's workers under liveness (agent.liveness.Pool): a worker stuck in one ADD past
its bound fails /healthz naming `pod-server-workers` until released; workers busy with ADDs that
each finish within it, and idle ones, never do. The clock is the test's (tests.liveness_rig), so
an ADD "runs" for minutes in milliseconds; the socket, the server and its pool are real."""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from agent.kube import api
from agent.netns import COMMAND_TIMEOUT_SECONDS
from agent.podserver.server import PodServer, work_bound
from plugin import wire
from tests.liveness_rig import Probed, hangs_of, probed
from tests.podserver.helpers import InMemoryPods, ScriptedRedirector, build_rig, call, cni_body
from tests.podserver.helpers import make_pod as pod_named

POOL = "pod-server-workers"
BOUND = 30.0
"""The workers' bound here: below the serving loop's own heartbeat bound (60 s), so moving the
clock past it judges the pool alone."""


@dataclass
class HookedRedirector(ScriptedRedirector):
    """Applies as ScriptedRedirector does, after the hook: held until `released` while `hold`
    is set (a netns operation that never returns), else the clock moved by `takes` seconds (a
    slow ADD that finishes)."""

    rig: Probed | None = None
    hold: bool = False
    takes: float = 0.0
    entered: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)
    seen: list[list[str]] = field(default_factory=list)
    """What liveness named failing at the end of each slow apply."""

    def apply(self, netns: str, pod: Mapping[str, Any]) -> str:
        self.entered.set()
        if self.hold:
            self.released.wait(30)
        elif self.rig is not None:
            self.rig.clock.now += self.takes
            self.seen.append(self.rig.failing())
        return super().apply(netns, pod)


@pytest.fixture
def socket_path(tmp_path: Path) -> Iterator[str]:
    short = Path("/tmp") / f"podlive-{os.getpid()}-{tmp_path.name[-12:]}"  # sun_path: 108 bytes
    yield str(short / "run" / wire.SOCKET_NAME)
    shutil.rmtree(short, ignore_errors=True)


@pytest.fixture
def rig() -> Iterator[Probed]:
    with probed() as rig:
        yield rig


def serve(rig: Probed, socket_path: str, redirector: HookedRedirector) -> PodServer:
    handlers = build_rig(InMemoryPods(pod_named()), redirector).handlers
    server = PodServer(socket_path, handlers, work_bound=BOUND, liveness=rig.liveness)
    server.start()
    return server


def test_the_bound_is_made_of_an_adds_timeouts() -> None:
    bound = work_bound(api.DEFAULT_TIMEOUTS, ztunnel_seconds=15.0)
    # every program an ADD may run, each to its timeout, is no hang; a worker past it is stuck
    assert bound > 8 * COMMAND_TIMEOUT_SECONDS + 15.0
    assert bound < 3600


def test_a_worker_stuck_in_an_add_fails_healthz_naming_the_pool_until_released(
    rig: Probed, socket_path: str
) -> None:
    redirector = HookedRedirector(rig=rig, hold=True)
    server = serve(rig, socket_path, redirector)
    before = hangs_of(POOL)
    with ThreadPoolExecutor(1) as pool:
        try:
            add = pool.submit(call, socket_path, "POST", wire.PATH_ADD, cni_body())
            assert redirector.entered.wait(10)
            rig.clock.now += BOUND - 1
            assert rig.healthz() == (200, "ok\n")  # within its bound: a slow ADD
            rig.clock.now += 2
            status, text = rig.healthz()
            assert status == 503
            assert text.startswith(f"not live: {POOL}\n{POOL}: one item running for 31 s ")
            assert rig.healthz()[0] == 503
            assert hangs_of(POOL) == before + 1  # once per stuck stretch, however often probed
            redirector.released.set()
            assert add.result(10)[0] == 200  # the stuck ADD finishes: the pool is live again
            rig.wait_live("the pool live once its item ended")
        finally:
            redirector.released.set()
            server.stop()
    assert POOL not in rig.failing()  # stopped: not judged


def test_workers_busy_with_adds_that_finish_in_time_and_idle_ones_stay_live(
    rig: Probed, socket_path: str
) -> None:
    redirector = HookedRedirector(rig=rig, takes=0.6 * BOUND)
    server = serve(rig, socket_path, redirector)
    try:
        for _ in range(5):  # 3 bounds of work in all, each ADD well within one
            assert call(socket_path, "POST", wire.PATH_ADD, cni_body())[0] == 200
        assert redirector.seen == [[]] * 5
        for _ in range(5):  # idle for 3 bounds: nothing in flight, nothing stuck
            rig.clock.now += 0.6 * BOUND
            threading.Event().wait(0.15)  # a round of the serving loop (its own heartbeat)
            assert POOL not in rig.failing()
        assert rig.healthz() == (200, "ok\n")
    finally:
        server.stop()
