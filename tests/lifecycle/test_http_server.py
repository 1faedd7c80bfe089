"""/healthz, /readyz, /metrics served from the agent process."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agent import metrics
from agent.http_server import HttpServer
from testbed.agent_host import http_get


class Flag:
    """A failing readiness check's reason, or None while it passes."""

    def __init__(self, value: str | None) -> None:
        self.value = value


def _broken() -> list[tuple[str, str]]:
    raise RuntimeError("boom")


@pytest.fixture
def server() -> Iterator[tuple[HttpServer, Flag, Flag]]:
    a, b = Flag(None), Flag(None)

    def failing() -> list[tuple[str, str]]:
        return [(name, f.value) for name, f in (("install", a), ("pods", b)) if f.value]

    srv = HttpServer(port=0, host="127.0.0.1", readiness=failing)
    srv.start()
    try:
        yield srv, a, b
    finally:
        srv.stop()
        srv.stop()  # idempotent


def test_ready_only_when_no_check_fails(server: tuple[HttpServer, Flag, Flag]) -> None:
    srv, a, b = server
    assert http_get(srv.bound_port, "/readyz") == (200, "ready\n")
    b.value = "no cache"
    assert http_get(srv.bound_port, "/readyz") == (503, "not ready: pods\npods: no cache\n")
    a.value = "entry missing"
    assert http_get(srv.bound_port, "/readyz") == (
        503,
        "not ready: install, pods\ninstall: entry missing\npods: no cache\n",
    )
    assert http_get(srv.bound_port, "/healthz") == (200, "ok\n")
    assert http_get(srv.bound_port, "/nope")[0] == 404


def test_metrics_has_istio_names(server: tuple[HttpServer, Flag, Flag]) -> None:
    srv, _, _ = server
    metrics.INSTALLS.labels(result="success").inc()
    code, body = http_get(srv.bound_port, "/metrics")
    assert code == 200
    for name in (
        "istio_cni_install_ready",
        'istio_cni_installs_total{result="success"}',
        "istio_cni_install_heals_total",
        "istio_cni_install_conflicts_total",
    ):
        assert name in body


def test_raising_check_is_not_ready() -> None:
    srv = HttpServer(port=0, host="127.0.0.1", readiness=_broken)
    srv.start()
    try:
        assert http_get(srv.bound_port, "/readyz") == (
            503,
            "not ready: readiness\nreadiness: raised RuntimeError: boom\n",
        )
    finally:
        srv.stop()


def test_default_listens_on_every_address() -> None:
    srv = HttpServer(port=0)
    srv.start()
    try:
        assert http_get(srv.bound_port, "/healthz")[0] == 200  # reached over IPv4 loopback
    finally:
        srv.stop()
