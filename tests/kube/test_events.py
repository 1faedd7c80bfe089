"""agent.kube.events: one Event per pod and reason, its repeats counted on it and patched at
most once per interval, all calls under one token bucket, a bounded table. The API is a test
double (CoreEventsDouble) recording calls, so that the counts and times can be asserted; the
node tier (tests/node/test_status.py) sees the real Events of a refused pod."""

from __future__ import annotations

import re
import threading
from typing import Any

import pytest

from agent.kube.events import EventRecorder, event_name
from tests.podserver.helpers import make_pod


class Response:
    def release_conn(self) -> None:
        pass


class CoreEventsDouble:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []
        self.sent = threading.Semaphore(0)

    def create_namespaced_event(self, namespace: str, body: Any, **_: Any) -> Response:
        self.calls.append(("create", body["metadata"]["name"], body["count"]))
        self.sent.release()
        return Response()

    def patch_namespaced_event(self, name: str, namespace: str, body: Any, **_: Any) -> Response:
        self.calls.append(("patch", name, body["count"]))
        self.sent.release()
        return Response()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def wait_calls(core: CoreEventsDouble, n: int) -> None:
    for _ in range(n):
        assert core.sent.acquire(timeout=5), core.calls


def test_repeats_count_on_one_event_patched_once_per_interval() -> None:
    core, clock = CoreEventsDouble(), Clock()
    rec = EventRecorder(core, node_name="n1", repeat_interval=60, clock=clock)
    rec.start()
    try:
        pod = make_pod(uid="u1")
        rec.record(pod, reason="RedirectRefused", message="first")
        wait_calls(core, 1)
        for _ in range(50):  # a crash loop: fifty more refusals within the interval
            rec.record(pod, reason="RedirectRefused", message="again")
        assert not core.sent.acquire(timeout=0.5)
        clock.now += 61
        rec.record(pod, reason="RedirectRefused", message="again")
        wait_calls(core, 1)
        name = core.calls[0][1]
        assert core.calls == [("create", name, 1), ("patch", name, 52)]
        assert name.startswith("web-0.")
    finally:
        rec.stop()


def test_a_flood_of_distinct_pods_is_bounded() -> None:
    core, clock = CoreEventsDouble(), Clock()
    rec = EventRecorder(core, node_name="n1", burst=5, refill_seconds=10, max_keys=20, clock=clock)
    rec.start()
    try:
        for i in range(100):
            rec.record(make_pod(f"p{i}", uid=f"u{i}"), reason="RedirectRefused", message="m")
        wait_calls(core, 5)
        assert not core.sent.acquire(timeout=0.5)  # the bucket is empty
        assert len(rec._entries) <= 20
        clock.now += 10
        rec.record(make_pod("p0", uid="u0"), reason="RedirectRefused", message="m")  # wakes it
        wait_calls(core, 1)
    finally:
        rec.stop()
    assert len(core.calls) == 6


SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
"""What the API server takes as an Event's name (IsDNS1123Subdomain), with at most 253."""
CUT = 253 - 17  # the name's room beside ".<16 hex digits>"

NAMES = {
    "short": "web-0",
    "max length": "a" * 253,
    "dash at the cut": "a" * (CUT - 1) + "-b",
    "dot at the cut": "a" * (CUT - 1) + ".b",
    "dashes and dots at the cut": "a" * (CUT - 5) + "-.-.-.-b",
    "a dash at every other place": "a-" * 126 + "a",
    "a dot at every other place": "a." * 126 + "a",
    "labels of max length": ".".join(["x" * 63] * 4)[:253],
    "not a pod name": "Web_0..-x-.ÄÖ\n",
    "nothing valid": "-._",
}


@pytest.mark.parametrize("pod", NAMES.values(), ids=NAMES.keys())
def test_event_names_are_valid_whatever_the_pod_name(pod: str) -> None:
    name = event_name(pod, "uid-1", "RedirectRefused", "node-1")
    assert len(name) <= 253 and SUBDOMAIN.match(name), name
    assert name == event_name(pod, "uid-1", "RedirectRefused", "node-1")


def test_event_names_are_one_per_pod_and_reason() -> None:
    pods = [*NAMES.values(), "a" * (CUT - 1) + "-c", "a" * CUT + "x", "a" * CUT + "y"]
    names = {
        event_name(pod, uid, reason, "node-1")
        for pod in pods
        for uid in ("", "uid-1", "uid-2")
        for reason in ("RedirectRefused", "RedirectFailed")
    }
    assert len(names) == len(pods) * 3 * 2
    assert event_name("web-0", "u", "R", "n").startswith("web-0.")
