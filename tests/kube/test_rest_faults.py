"""The agent's REST client against a strict fake API server (testbed.fakeapi) in the faults
client-go's rest client handles: Retry-After on 429 and 5xx, its token bucket, a token the API
server refuses (401), a silent watch, the pool under a burst and released answers."""

from __future__ import annotations

import logging
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.errors import ApiForbidden, ApiLookupError
from agent.kube import KubeClients, api, build_clients, rest
from agent.node_taint import TAINT_KEY, remove_taint
from agent.pods.pod_cache import PodCache
from testbed.fakeapi import FakeApiServer, Reply, Request
from testbed.wait import wait_for

POD_PATH = "/api/v1/namespaces/app/pods/web"


def a_pod(version: str = "5") -> dict[str, Any]:
    meta = {"name": "web", "namespace": "app", "uid": "u1", "resourceVersion": version}
    return {"metadata": meta, "spec": {"nodeName": "node-1"}, "status": {}}


@pytest.mark.parametrize("code", [429, 503], ids=["429", "503"])
def test_retry_after_holds_the_lookup_back(
    fake_api: FakeApiServer, fake_api_clients: KubeClients, code: int
) -> None:
    answers = iter([Reply(code, headers={"Retry-After": "2"})])
    fake_api.route = lambda request: next(answers, Reply(body=a_pod()))
    cache = PodCache(fake_api_clients.core, "node-1")  # not started: the lookup is a GET
    assert cache.get("app", "web") is not None
    times = [r.at for r in fake_api.seen("GET", POD_PATH)]
    # Before: GETs at 0, 0.13, 0.38, 0.9, 1.9 s, each one answered 429 again.
    assert len(times) == 2 and times[1] - times[0] >= 1.95, times


def test_retry_after_beyond_the_lookups_timeout_is_not_sent_again(
    fake_api: FakeApiServer, fake_api_clients: KubeClients
) -> None:
    fake_api.route = lambda request: Reply(429, headers={"Retry-After": "30"})
    cache = PodCache(fake_api_clients.core, "node-1", get_first_delay_seconds=0.05)
    with pytest.raises(ApiLookupError, match="Retry-After"):
        cache.get("app", "web")
    assert len(fake_api.seen("GET", POD_PATH)) == 1  # the others waited their turn, in vain


def test_concurrent_lookups_keep_to_the_rate(
    fake_api: FakeApiServer, fake_api_clients: KubeClients
) -> None:
    fake_api.route = lambda request: Reply(404)
    cache = PodCache(fake_api_clients.core, "node-1")  # 5 tries over 1.9 s
    outcomes: list[str] = []

    def lookup(name: str) -> None:
        try:
            outcomes.append(repr(cache.get("app", name)))
        except ApiLookupError as e:  # its turn would have come after the lookup's 5 s
            outcomes.append(str(e))

    threads = [threading.Thread(target=lookup, args=(f"web-{i}",)) for i in range(20)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    within = [r for r in fake_api.requests if r.at - started <= 2.1]
    # Before: all 100 GETs in 2 s. client-go's bucket: burst 10, then 5 a second.
    assert len(within) <= 10 + 5 * 2.1 + 1, len(within)
    assert len(fake_api.requests) <= 10 + 5 * 5 + 1
    assert len(outcomes) == 20
    assert all(o == "None" or "client rate limit" in o for o in outcomes), outcomes


def test_a_refused_token_is_read_again_at_once(fake_api: FakeApiServer, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("old\n")
    fake_api.tokens = {"old"}
    kubeconfig = yaml.safe_load(fake_api.kubeconfig().read_text())
    kubeconfig["users"][0]["user"] = {"tokenFile": str(token_file)}
    (tmp_path / "kubeconfig").write_text(yaml.safe_dump(kubeconfig))
    fake_api.route = lambda request: Reply(body=a_pod())
    made = build_clients({"KUBECONFIG": str(tmp_path / "kubeconfig")})
    try:
        api.get_json(made.core.read_namespaced_pod, "web", "app", timeout=5.0)
        fake_api.tokens = {"new"}  # the old one revoked; kubelet writes the new one
        token_file.write_text("new\n")
        pod = api.get_json(made.core.read_namespaced_pod, "web", "app", timeout=5.0)
        assert pod["metadata"]["name"] == "web"  # before: 401 until the 60 s period ran out
        fake_api.tokens = {"newer"}  # refused again at once: not re-read before 5 s
        token_file.write_text("newer\n")
        with pytest.raises(ApiForbidden):
            api.get_json(made.core.read_namespaced_pod, "web", "app", timeout=5.0)
    finally:
        made.close()
    assert [r.token for r in fake_api.requests] == ["old", "old", "new", "new"]


def test_a_silent_watch_is_noticed_and_resumed(
    fake_api: FakeApiServer, fake_api_clients: KubeClients
) -> None:
    # Bookmarks come about every 60 s: two intervals and some slack, not the watch's 4-8 min.
    assert api.Timeouts().watch(240) == (api.SLOW_CONNECT_SECONDS, 130.0)
    assert api.Timeouts().watch(60) == (api.SLOW_CONNECT_SECONDS, 90.0)  # the server ends it

    def route(request: Request) -> Reply:
        if request.query.get("watch") != "true":
            return Reply(body={"metadata": {"resourceVersion": "100"}, "items": []})
        return Reply(events=[], then="silent")

    fake_api.route = route
    cache = PodCache(fake_api_clients.core, "node-1", timeouts=api.Timeouts(watch_idle_seconds=1.0))
    cache.start()
    try:
        wait_for(lambda: len(fake_api.seen(watch="true")) >= 2, "a second watch", timeout=10)
    finally:
        cache.stop()


def test_a_quiet_watch_is_resumed_at_once_without_a_warning(
    fake_api: FakeApiServer, fake_api_clients: KubeClients, caplog: pytest.LogCaptureFixture
) -> None:
    """A server that sends no bookmark on a quiet watch (kube-apiserver while its watch cache
    does not move on): each watch goes silent until its idle read timeout. That is a quiet
    cluster, not a fault: the watch resumes from the same version, with no warning, no back-off
    and no list."""

    def route(request: Request) -> Reply:
        if request.query.get("watch") != "true":
            return Reply(body={"metadata": {"resourceVersion": "100"}, "items": []})
        return Reply(events=[], then="silent")

    fake_api.route = route
    cache = PodCache(fake_api_clients.core, "node-1", timeouts=api.Timeouts(watch_idle_seconds=0.5))
    with caplog.at_level(logging.DEBUG, logger="agent.pods.cache"):
        cache.start()
        try:
            wait_for(lambda: len(fake_api.seen(watch="true")) >= 4, "four watches", timeout=10)
        finally:
            cache.stop()
    asked = [r.query["resourceVersion"] for r in fake_api.seen(watch="true")]
    assert set(asked) == {"100"}, asked
    assert cache.relists == 1
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not warned, warned
    assert any("watch quiet; resuming" in r.getMessage() for r in caplog.records)


def test_sockets_send_keepalives(fake_api: FakeApiServer, fake_api_clients: KubeClients) -> None:
    fake_api.route = lambda request: Reply(body=a_pod())
    api.get_json(fake_api_clients.core.read_namespaced_pod, "web", "app", timeout=5.0)
    pool = fake_api_clients.api._pool.connection_from_url(fake_api.url)
    socks = [c.sock for c in list(pool.pool.queue) if c is not None and c.sock is not None]
    assert socks
    for sock in socks:
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 30
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == 10
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 3


def test_a_burst_reuses_the_pools_connections(
    fake_api: FakeApiServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def slow(request: Request) -> Reply:
        time.sleep(0.2)
        return Reply(body=a_pod())

    fake_api.route = slow
    client = rest.RestClient(
        build_clients({"KUBECONFIG": str(fake_api.kubeconfig())}).api.configuration,
        qps=1000,
        burst=1000,
    )
    core = rest.CoreV1(client)

    def lookups() -> None:
        for _ in range(3):
            api.get_json(core.read_namespaced_pod, "web", "app", timeout=(5.0, 5.0))

    caplog.set_level(logging.WARNING, logger="urllib3")
    threads = [threading.Thread(target=lookups) for _ in range(2 * rest.POOL_SIZE)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    client.close()
    assert len(fake_api.requests) == 6 * rest.POOL_SIZE
    assert fake_api.connections <= rest.POOL_SIZE  # before: one per call past the pool's size
    assert "Connection pool is full" not in caplog.text


def test_the_taint_patch_is_released(
    fake_api: FakeApiServer, fake_api_clients: KubeClients
) -> None:
    taint = {"key": TAINT_KEY, "effect": "NoSchedule"}

    def route(request: Request) -> Reply:
        node = {"metadata": {"name": "node-1"}, "spec": {"taints": [taint]}}
        return Reply(body=node)

    fake_api.route = route
    for _ in range(5):
        assert remove_taint(fake_api_clients.core, "node-1") == ["NoSchedule"]
    assert len(fake_api.seen("PATCH", "/api/v1/nodes/node-1")) == 5
    assert fake_api.connections == 1  # before: a new connection each round
