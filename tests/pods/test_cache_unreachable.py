"""The pod cache when the API server cannot be reached (a real client, a loopback port nobody
listens on): lookups fail with ApiLookupError (the server turns it into CNI code 11), the
cache never claims to be ready, and stop() still returns."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s

from agent.errors import ApiLookupError
from agent.pods.pod_cache import PodCache
from testbed.wait import wait_for
from tests.podserver.helpers import ObservedCore

# stop() interrupts the back-off wait: well under the shortest back-off the test leaves it in.
STOP_BOUND = 2.0


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
    with pytest.raises(ApiLookupError, match="get pod app/web-0"):
        cache.get("app", "web-0")


def test_never_ready_and_stops_while_backing_off(dead_core: Any) -> None:
    observed = ObservedCore(dead_core)
    cache = PodCache(observed, "node-1", backoff_max_seconds=60)
    cache.start()
    try:
        # Three failed lists: the back-off before the fourth is 4 s (+-20 % jitter), so a
        # stop() that waited it out would take at least 3.2 s.
        wait_for(lambda: observed.failures >= 3, "three failed lists", 30, interval=0.01)
        assert not cache.ready()
    finally:
        started = time.monotonic()
        cache.stop()
        took = time.monotonic() - started
    assert took < STOP_BOUND, f"stop() took {took:.2f}s: it waited out the back-off"
    assert observed.lists == 0 and observed.watches == 0


def test_node_name_is_required(dead_core: Any) -> None:
    with pytest.raises(ValueError, match="NODE_NAME"):
        PodCache(dead_core, "")
