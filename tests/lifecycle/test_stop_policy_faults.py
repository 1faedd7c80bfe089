"""The SIGTERM decision against a strict fake API server (testbed.fakeapi): only a definite
answer uninstalls (the DaemonSet gone, being deleted, or the agent's pod and its DaemonSet both
gone); a refused credential (401/403) or a failing API server keeps the plugin, saying why.
An uninstall seconds after a connectivity blip is still heard by the watch of the DaemonSet."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from agent.install.stop_policy import StopDecision, decide_from_cluster
from agent.kube import KubeClients
from agent.pods.own_daemonset import OwnDaemonSetWatch
from testbed.fakeapi import FakeApiServer, Reply, Request, watch_events
from testbed.wait import WaitTimeout, wait_for

NS = "istio-system"
POD = "istio-cni-node-x7k2p"
POD_PATH = f"/api/v1/namespaces/{NS}/pods/{POD}"
DS_PATH = f"/apis/apps/v1/namespaces/{NS}/daemonsets/istio-cni-node"
NODE_PATH = "/api/v1/nodes/node-1"
OWNER = {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "istio-cni-node", "uid": "ds-1"}
AGENT_POD = {"metadata": {"name": POD, "namespace": NS, "ownerReferences": [OWNER]}}
DAEMONSET = {"metadata": {"name": "istio-cni-node", "namespace": NS, "uid": "ds-1"}, "spec": {}}
NODE = {"metadata": {"name": "node-1", "labels": {}}}


def answers(pod: Reply, ds: Reply, node: Reply | None = None) -> Callable[[Request], Reply]:
    by_path = {POD_PATH: pod, DS_PATH: ds, NODE_PATH: node or Reply(body=NODE)}
    return lambda request: by_path.get(request.path, Reply(404))


CASES = [
    ("pod-401", answers(Reply(401), Reply(body=DAEMONSET)), False, "refused"),
    ("ds-401", answers(Reply(body=AGENT_POD), Reply(401)), False, "refused"),
    ("ds-403", answers(Reply(body=AGENT_POD), Reply(403)), False, "refused"),
    (
        "node-403",
        answers(Reply(body=AGENT_POD), Reply(body=DAEMONSET), Reply(403)),
        False,
        "refused",
    ),
    ("ds-503", answers(Reply(body=AGENT_POD), Reply(503)), False, "unreachable"),
    ("upgrade", answers(Reply(body=AGENT_POD), Reply(body=DAEMONSET)), False, "still runs"),
    ("ds-404", answers(Reply(body=AGENT_POD), Reply(404)), True, "DaemonSet is gone"),
    ("pod-404-ds-404", answers(Reply(404), Reply(404)), True, "DaemonSet is gone"),
    ("pod-404-ds-there", answers(Reply(404), Reply(body=DAEMONSET)), False, "still runs"),
    (
        "ds-replaced",
        answers(Reply(body=AGENT_POD), Reply(body={**DAEMONSET, "metadata": {"uid": "ds-2"}})),
        True,
        "DaemonSet is gone",
    ),
]


@pytest.mark.parametrize(
    ("route", "uninstall", "reason"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_only_a_definite_answer_uninstalls(
    fake_api: FakeApiServer,
    fake_api_clients: KubeClients,
    route: Callable[[Request], Reply],
    uninstall: bool,
    reason: str,
) -> None:
    fake_api.route = route
    decision = decide_from_cluster(
        "auto", pod_name=POD, pod_namespace=NS, node_name="node-1", clients=fake_api_clients
    )
    assert (decision.uninstall, reason in decision.reason) == (uninstall, True), decision.reason


def test_a_refusal_names_the_way_out(
    fake_api: FakeApiServer, fake_api_clients: KubeClients
) -> None:
    fake_api.tokens = {"another"}  # the agent's token is not accepted any more
    decision = decide_from_cluster(
        "auto", pod_name=POD, pod_namespace=NS, node_name="node-1", clients=fake_api_clients
    )
    assert not decision.uninstall
    assert "HTTP 401" in decision.reason and "istio-cni-agent uninstall" in decision.reason
    assert [r.path for r in fake_api.requests] == [POD_PATH]


def own_daemonset_route(deleted: bool) -> Callable[[Request], Reply]:
    """The DaemonSet by name: listed, then a watch telling (or not) of its deletion. A list or
    watch without the name's field selector is refused, as the Role (resourceNames) refuses it."""

    def route(request: Request) -> Reply:
        if request.path != f"/apis/apps/v1/namespaces/{NS}/daemonsets":
            return Reply(404)
        if request.query.get("fieldSelector") != "metadata.name=istio-cni-node":
            return Reply(403)
        if request.query.get("watch") != "true":
            return Reply(body={"metadata": {"resourceVersion": "10"}, "items": [DAEMONSET]})
        gone = {**DAEMONSET, "metadata": {**DAEMONSET["metadata"], "resourceVersion": "11"}}
        events = watch_events(("DELETED", gone)) if deleted else []
        return Reply(events=events, then="silent")

    return route


@pytest.mark.parametrize("deleted", [True, False], ids=["deleted", "not-deleted"])
def test_a_refusal_after_the_watch_saw_the_daemonset_deleted(
    fake_api: FakeApiServer, fake_api_clients: KubeClients, deleted: bool
) -> None:
    fake_api.route = own_daemonset_route(deleted)
    own = OwnDaemonSetWatch.for_pod(fake_api_clients.apps, POD, NS)
    own.start()
    try:
        wait_for(lambda: len(fake_api.seen(watch="true")) == 1, "the DaemonSet's watch")
        wait_for(lambda: bool(own.gone()) is deleted, "the watch's word")
        fake_api.tokens = set()  # helm uninstall: ServiceAccount and RBAC gone before SIGTERM
        decision = decide_from_cluster(
            "auto",
            pod_name=POD,
            pod_namespace=NS,
            node_name="node-1",
            clients=fake_api_clients,
            watched_gone=own.gone,
        )
    finally:
        own.stop()
    assert decision.uninstall is deleted, decision.reason
    assert ("watch saw the DaemonSet deleted" in decision.reason) is deleted
    assert ("refused" in decision.reason) is not deleted


BLIP_SECONDS = 10.0
"""Every watch reset for this long: four resets in a row, the caches' back-off grown to 8 s."""
UNINSTALL_AFTER_SECONDS = 3.0
"""`helm uninstall` this long after the blip."""
SIGTERM_AFTER_SECONDS = 2.0
"""The kubelet's SIGTERM at most this long after the uninstall (the garbage collector deletes
the pod once it has seen the DaemonSet gone)."""


class UninstallingApi:
    """The DaemonSet's list and watch on the fake API server: an open watch lasts until
    `uninstall()`, and tells of the deletion; while `blip` is set every watch is reset at once.
    `uninstall()` also revokes the agent's token, as helm deletes the ServiceAccount and RBAC
    with the DaemonSet."""

    def __init__(self, fake: FakeApiServer) -> None:
        self.fake = fake
        self.blip, self.uninstalled = threading.Event(), threading.Event()
        fake.route = self.route

    def route(self, request: Request) -> Reply:
        if request.path != f"/apis/apps/v1/namespaces/{NS}/daemonsets":
            return Reply(404)
        if request.query.get("watch") != "true":
            return Reply(body={"metadata": {"resourceVersion": "10"}, "items": [DAEMONSET]})
        if self.blip.is_set():
            return Reply(events=[], then="reset")
        return Reply(events=self.stream(), then="reset")

    def stream(self) -> Iterator[dict[str, object]]:
        if self.uninstalled.wait(60):  # an open stream hears the deletion as it happens
            gone = {**DAEMONSET, "metadata": {**DAEMONSET["metadata"], "resourceVersion": "11"}}
            yield from watch_events(("DELETED", gone))

    def uninstall(self) -> None:
        self.uninstalled.set()
        self.fake.tokens = set()

    def sigterm(self, own: OwnDaemonSetWatch, clients: KubeClients) -> StopDecision:
        """The decision at SIGTERM, which comes SIGTERM_AFTER_SECONDS after the uninstall at
        the latest, heard or not."""
        with contextlib.suppress(WaitTimeout):
            wait_for(lambda: bool(own.gone()), "the watch's word", SIGTERM_AFTER_SECONDS)
        return decide_from_cluster(
            "auto",
            pod_name=POD,
            pod_namespace=NS,
            node_name="node-1",
            clients=clients,
            watched_gone=own.gone,
        )


def watches(fake: FakeApiServer) -> list[float]:
    """When each watch of the DaemonSet was asked, in seconds from the first."""
    seen = fake.seen(watch="true")
    return [round(r.at - seen[0].at, 2) for r in seen]


def test_an_uninstall_seconds_after_a_connectivity_blip_is_heard(
    fake_api: FakeApiServer, fake_api_clients: KubeClients
) -> None:
    api = UninstallingApi(fake_api)
    api.blip.set()
    own = OwnDaemonSetWatch.for_pod(fake_api_clients.apps, POD, NS)
    own.start()
    try:
        wait_for(lambda: own.ready(), "the DaemonSet listed")
        time.sleep(BLIP_SECONDS)
        api.blip.clear()
        time.sleep(UNINSTALL_AFTER_SECONDS)
        api.uninstall()
        decision = api.sigterm(own, fake_api_clients)
    finally:
        api.uninstall()
        own.stop()
    assert decision.uninstall, (decision.reason, watches(fake_api))
    assert "watch saw the DaemonSet deleted" in decision.reason, decision.reason
