"""The pod cache when the API server cannot be reached (a real client, a loopback port nobody
listens on): lookups fail with PodLookupError (the server turns it into CNI code 11), the
cache never claims to be ready, and stop() still returns."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s

from agent.pods.cache import PodCache, PodLookupError


@pytest.fixture
def dead_core() -> Iterator[Any]:
    with socket.socket() as s:  # a port that was free a moment ago: connections are refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    configuration = k8s.Configuration()
    configuration.host = f"http://127.0.0.1:{port}"
    configuration.retries = False
    api = k8s.ApiClient(configuration)
    yield k8s.CoreV1Api(api)
    api.close()


def test_get_raises_lookup_error_naming_the_pod(dead_core: Any) -> None:
    cache = PodCache(dead_core, "node-1", get_tries=3, get_first_delay_seconds=0.01)
    with pytest.raises(PodLookupError, match="get pod app/web-0"):
        cache.get("app", "web-0")


def test_never_ready_and_stops_while_backing_off(dead_core: Any) -> None:
    cache = PodCache(dead_core, "node-1", backoff_max_seconds=60)
    cache.start()
    try:
        time.sleep(1.0)  # a few failed lists, then a long back-off wait
        assert not cache.ready()
    finally:
        cache.stop()  # the back-off wait is interrupted (pytest-timeout guards a hang)


def test_node_name_is_required(dead_core: Any) -> None:
    with pytest.raises(ValueError, match="NODE_NAME"):
        PodCache(dead_core, "")
