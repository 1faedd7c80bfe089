"""Each ADD's outcome noted for `istio-cni-agent status` (captured, skipped, refused, with why),
and a Warning Event on a sidecar pod whose ADD is refused. The redirector is the scripted
stand-in of helpers.py; the Event sink is a test double (EventsDouble) recording what it got."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from agent.config import Settings
from agent.errors import RedirectError
from agent.kube import KubeClients
from agent.pods import states
from agent.pods.pod_cache import PodCache
from agent.pods.states import PodStates
from agent.podserver.handlers import REFUSED_EVENT, PodHandlers
from agent.podserver.metrics import PluginMetrics
from agent.podserver.sandboxes import SandboxStore
from agent.podserver.service import PodService
from tests.podserver.helpers import (
    InMemoryPods,
    ScriptedRedirector,
    StandInDecision,
    cni_body,
    make_pod,
)


class EventsDouble:
    def __init__(self) -> None:
        self.got: list[tuple[str, str, str]] = []

    def record(self, pod: Any, *, reason: str, message: str) -> None:
        self.got.append((pod["metadata"]["name"], reason, message))


def handlers(
    pods: InMemoryPods, redirector: ScriptedRedirector
) -> tuple[PodHandlers, PodStates, EventsDouble]:
    noted, events = PodStates(), EventsDouble()
    made = PodHandlers(
        pods=pods,
        redirector=redirector,
        sandboxes=SandboxStore(),
        readiness=lambda: None,
        metrics=PluginMetrics(CollectorRegistry()),
        states=noted,
        events=events,
    )
    return made, noted, events


def outcome(noted: PodStates, uid: str) -> tuple[str, str]:
    record = noted.get(uid)
    assert record is not None
    got = record.outcomes[states.ADD]
    return got.state, got.reason


def test_captured_and_skipped_are_noted_without_events() -> None:
    redirector = ScriptedRedirector(decisions={"plain": StandInDecision(False, "no istio-proxy")})
    pods = InMemoryPods(make_pod(uid="u1"), make_pod("plain", uid="u2", sidecar=False))
    made, noted, events = handlers(pods, redirector)
    assert made.add(cni_body(uid="u1")).status == 200
    assert made.add(cni_body(pod="plain", uid="u2")).status == 200
    assert outcome(noted, "u1") == (
        states.CAPTURED,
        "sidecar istio-proxy present; rules applied with iptables-nft",
    )
    assert outcome(noted, "u2") == (states.SKIPPED, "no istio-proxy")
    assert events.got == []


def test_a_refused_add_is_noted_and_reported_on_the_pod() -> None:
    redirector = ScriptedRedirector(apply_error=RedirectError("iptables-restore failed"))
    made, noted, events = handlers(InMemoryPods(make_pod(uid="u1")), redirector)
    reply = made.add(cni_body(uid="u1"))
    assert reply.status == 500
    state, reason = outcome(noted, "u1")
    assert state == states.REFUSED and "iptables-restore failed" in reason
    assert [(name, why) for name, why, _ in events.got] == [("web-0", REFUSED_EVENT)]
    assert "iptables-restore failed" in events.got[0][2]


def test_a_pod_not_found_is_noted_by_name_without_an_event() -> None:
    made, noted, events = handlers(InMemoryPods(), ScriptedRedirector())
    assert made.add(cni_body(uid="")).status == 503
    record = noted.get("", "app", "web-0")
    assert record is not None and record.outcomes[states.ADD].state == states.REFUSED
    assert events.got == []


def no_clients() -> KubeClients:
    raise AssertionError("the cache is given: no clients are built")


def test_a_deleted_pods_outcomes_go_with_it() -> None:
    """The pod server's cache tells the records of the pods the API deleted: under churn they
    follow the node's pods instead of piling up to the records' limit."""
    cache = PodCache(core=None, node_name="node-1")  # fed events by hand: no API calls
    noted = PodStates()
    PodService(
        Settings(), "node-1", no_clients, lambda: True,
        cache=cache, states=noted, metrics=PluginMetrics(CollectorRegistry()),
    )  # fmt: skip
    for i in range(3):
        pod = make_pod(f"web-{i}", uid=f"uid-{i}")
        pod["metadata"]["resourceVersion"] = str(10 + i)
        cache.apply_event({"type": "ADDED", "object": pod}, str(9 + i))
        noted.note(namespace="app", name=f"web-{i}", uid=f"uid-{i}", kind=states.ADD,
                   state=states.CAPTURED, reason="")  # fmt: skip
    noted.note(namespace="app", name="web-9", uid="", kind=states.ADD, state=states.REFUSED,
               reason="pod not found")  # fmt: skip
    gone = make_pod("web-1", uid="uid-1")
    gone["metadata"]["resourceVersion"] = "20"
    cache.apply_event({"type": "DELETED", "object": gone}, "12")
    assert noted.get("uid-1") is None
    assert noted.get("uid-0") is not None and noted.get("uid-2") is not None
    by_name = make_pod("web-9", uid="uid-9")
    by_name["metadata"]["resourceVersion"] = "21"
    cache.apply_event({"type": "ADDED", "object": by_name}, "20")
    cache.apply_event({"type": "DELETED", "object": by_name}, "21")
    assert noted.get("", "app", "web-9") is None, "the record by name of an ADD that found none"
    assert len(noted) == 2
