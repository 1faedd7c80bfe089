"""A Liveness on a clock the test moves, judged by the agent's real /healthz: how the tests of
heartbeats hang a worker for longer than its bound without waiting that long."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import REGISTRY

from agent.http_server import HttpServer
from agent.liveness import Liveness
from testbed.agent_host import http_get
from testbed.wait import wait_for


class Clock:
    """time.monotonic's stand-in: moves only when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Probed:
    """`liveness` on `clock`, served by a real HttpServer on loopback."""

    def __init__(self) -> None:
        self.clock = Clock()
        self.liveness = Liveness(self.clock)
        self.server = HttpServer(port=0, host="127.0.0.1", loops=self.liveness.failing)

    def healthz(self) -> tuple[int, str]:
        return http_get(self.server.bound_port, "/healthz")

    def failing(self) -> list[str]:
        """The names /healthz would give now."""
        return [loop for loop, _ in self.liveness.failing()]

    def wait_live(self, what: str) -> None:
        wait_for(lambda: self.healthz()[0] == 200, what, 10, interval=0.02)


@contextmanager
def probed() -> Iterator[Probed]:
    rig = Probed()
    rig.server.start()
    try:
        yield rig
    finally:
        rig.server.stop()


def hangs_of(loop: str) -> float:
    """istio_cni_loop_hangs_total{loop} in the process's registry."""
    return REGISTRY.get_sample_value("istio_cni_loop_hangs_total", {"loop": loop}) or 0.0
