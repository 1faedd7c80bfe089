"""The pod server's CNI ADD/DEL for ambient pods (agent.podserver.handlers + ambient), with the
real enrollment decisions and a MeshDataplane over named fakes: enroll with the request's netns
and IPs, fail closed, enableAmbientDetectionRetry, sidecar pods unchanged, DEL releases, and
with the real watch beside it one DelWorkload per removal, as Istio sends."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from agent.ambient.enroller import AmbientEnroller
from agent.ambient.mesh import MeshDataplane, rule_options_for
from agent.ambient.watch import AmbientWatch, Event
from agent.errors import ApiLookupError
from agent.label_selectors import DEFAULT_ENABLEMENT_SELECTORS
from agent.podserver.handlers import PodHandlers
from agent.podserver.metrics import PluginMetrics
from agent.podserver.sandboxes import SandboxStore
from agent.rules.ambient.options import PodRuleOptions
from plugin import wire
from tests.ambient.fakes import (
    FakeAnnotator,
    FakeHostProbeRules,
    FakeNetnsFinder,
    FakePodRules,
    FakeZtunnelLink,
    Journal,
    namespace,
    pod,
)
from tests.podserver.helpers import InMemoryPods, RealDecisions, make_pod

AMBIENT = {"istio.io/dataplane-mode": "ambient"}


class FakeNamespaces:
    """`items`: the namespace cache; `api`: what the API server holds now (the same unless a
    test makes the cache lag behind)."""

    def __init__(self, *items: dict[str, Any]) -> None:
        self.items = {n["metadata"]["name"]: n for n in items}
        self.api = dict(self.items)
        self.error: Exception | None = None
        self.read_error: Exception | None = None
        self.retries: list[bool] = []
        self.reads: list[str] = []

    def get_namespace(self, name: str, *, retry: bool = True) -> dict[str, Any] | None:
        self.retries.append(retry)
        if self.error is not None:
            raise self.error
        return self.items.get(name)

    def read_namespace(self, name: str) -> dict[str, Any] | None:
        self.reads.append(name)
        if self.read_error is not None:
            raise self.read_error
        return self.api.get(name)


class Rig:
    def __init__(
        self,
        tmp_path: Path,
        *pods: dict[str, Any],
        retry: bool = False,
        fail_open: bool = False,
    ) -> None:
        self.journal: Journal = []
        self.rules = FakePodRules(self.journal)
        self.ztunnel = FakeZtunnelLink(self.journal)
        self.annotator = FakeAnnotator(self.journal)
        self.host = FakeHostProbeRules(self.journal)
        self.mesh = MeshDataplane(
            pod_rules=self.rules,
            host_rules=self.host,
            ztunnel=self.ztunnel,
            annotator=self.annotator,
            find_netns=FakeNetnsFinder(self.journal),
            options_for=rule_options_for(PodRuleOptions()),
        )
        self.namespaces = FakeNamespaces(namespace("app", AMBIENT), namespace("plain"))
        self.netns = tmp_path / "cni-1"
        self.netns.touch()
        self.redirector = RealDecisions()
        self.handlers = PodHandlers(
            pods=InMemoryPods(*pods),
            redirector=self.redirector,
            sandboxes=SandboxStore(),
            readiness=lambda: None,
            metrics=PluginMetrics(CollectorRegistry()),
            ambient=AmbientEnroller(
                namespaces=self.namespaces,
                mesh=self.mesh,
                selectors=DEFAULT_ENABLEMENT_SELECTORS,
                exclude_namespaces=["kube-system"],
                system_namespace="istio-system",
                detection_retry=retry,
                fail_open=fail_open,
            ),
        )

    def body(
        self,
        command: str = "ADD",
        name: str = "web-0",
        ns: str = "app",
        *,
        sandbox: str = "c1",
        netns: Path | None = None,
        ip: str = "10.0.0.5",
    ) -> bytes:
        prev = {"cniVersion": "1.0.0", "ips": [{"address": f"{ip}/24"}]}
        return wire.encode(
            wire.cni_request(
                command=command,
                container_id=sandbox,
                netns=str(netns or self.netns),
                ifname="eth0",
                pod_name=name,
                pod_namespace=ns,
                pod_uid="",
                cni_version="1.0.0",
                prev_result=prev,
            )
        )


def new_pod(name: str = "web-0", ns: str = "app", **kw: Any) -> dict[str, Any]:
    return pod(name, namespace=ns, ips=(), phase="Pending", **kw)  # no IP in the API yet


def test_ambient_pod_is_enrolled_with_request_netns_and_ips(tmp_path: Path) -> None:
    rig = Rig(tmp_path, new_pod())
    reply = rig.handlers.add(rig.body())
    assert reply.status == 200, reply.body
    assert reply.result == wire.RESULT_REDIRECTED and "ambient" in str(reply.body["reason"])
    assert ("rules.apply", str(rig.netns)) in rig.journal
    assert ("host.add", "uid-1", "10.0.0.5") in rig.journal
    assert rig.ztunnel.workloads["uid-1"].ips == ("10.0.0.5",)
    assert rig.annotator.values == {"app/web-0": "enabled"}
    assert rig.redirector.applied == []  # no sidecar rules


def test_rules_failure_fails_the_add(tmp_path: Path) -> None:
    rig = Rig(tmp_path, new_pod())
    rig.rules.fail_apply = True
    reply = rig.handlers.add(rig.body())
    assert reply.status == 500 and "in-pod rules" in str(reply.body["msg"])
    assert rig.mesh.snapshot() == []


def test_ztunnel_away_fails_the_add_retryably(tmp_path: Path) -> None:
    rig = Rig(tmp_path, new_pod())
    rig.ztunnel.connected = False
    reply = rig.handlers.add(rig.body())
    assert reply.status == 503 and reply.body["code"] == 11
    assert rig.annotator.values == {"app/web-0": "pending"}


def test_namespace_lookup_failure_without_retry_still_fails_closed(tmp_path: Path) -> None:
    """Istio's value without the retry: one try, and when it fails the ADD fails (the runtime
    retries): the agent cannot tell whether the pod must be captured."""
    rig = Rig(tmp_path, new_pod())
    rig.namespaces.error = ApiLookupError("get namespace app: API server answered 503")
    reply = rig.handlers.add(rig.body())
    assert reply.status == 503 and reply.body["code"] == 11
    assert "ambient detection" in str(reply.body["msg"])
    assert rig.namespaces.retries == [False] and rig.mesh.snapshot() == []


def test_namespace_lookup_failure_fails_open_only_when_the_user_opts_out(tmp_path: Path) -> None:
    rig = Rig(tmp_path, new_pod(), fail_open=True)
    rig.namespaces.error = ApiLookupError("get namespace app: API server answered 503")
    reply = rig.handlers.add(rig.body())
    assert reply.status == 200 and reply.result == wire.RESULT_SKIPPED  # sidecar decision
    assert rig.namespaces.retries == [False] and rig.mesh.snapshot() == []


def test_namespace_lookup_failure_with_retry_fails_closed(tmp_path: Path) -> None:
    rig = Rig(tmp_path, new_pod(), retry=True)
    rig.namespaces.error = ApiLookupError("get namespace app: API server answered 503")
    reply = rig.handlers.add(rig.body())
    assert reply.status == 503 and reply.body["code"] == 11
    assert "ambient detection" in str(reply.body["msg"])
    assert rig.namespaces.retries == [True]


@pytest.mark.parametrize(
    ("the_pod", "ns"),
    [
        (new_pod(labels={"istio.io/dataplane-mode": "none"}), "app"),
        (new_pod("web-0", "plain"), "plain"),
    ],
    ids=["opt-out", "plain-namespace"],
)
def test_not_ambient_pods_keep_the_sidecar_decision(
    tmp_path: Path, the_pod: dict[str, Any], ns: str
) -> None:
    rig = Rig(tmp_path, the_pod)
    reply = rig.handlers.add(rig.body(ns=ns))
    assert reply.result == wire.RESULT_SKIPPED and rig.mesh.snapshot() == []


def test_sidecar_pod_in_ambient_namespace_gets_sidecar_rules(tmp_path: Path) -> None:
    rig = Rig(tmp_path, make_pod())  # injected sidecar
    reply = rig.handlers.add(rig.body())
    assert reply.result == wire.RESULT_REDIRECTED
    assert rig.redirector.applied == [(str(rig.netns), "web-0")] and rig.mesh.snapshot() == []


def test_del_releases_the_enrolled_pod(tmp_path: Path) -> None:
    rig = Rig(tmp_path, new_pod())
    rig.handlers.add(rig.body())
    reply = rig.handlers.delete(rig.body("DEL"))
    assert reply.status == 200 and "released" in str(reply.body["reason"])
    assert ("host.remove", "uid-1") in rig.journal and ("ztunnel.remove", "uid-1") in rig.journal
    assert ("rules.remove", str(rig.netns)) not in rig.journal  # the netns goes with the sandbox
    assert rig.mesh.snapshot() == [] and json.dumps(rig.annotator.values) == '{"app/web-0": null}'


# -- the IPs of the CNI result, the sandbox of the ADD ---------------------------------------------


def test_the_probe_set_gets_the_cni_results_ips_not_the_pods_status(tmp_path: Path) -> None:
    """A re-created sandbox: the pod's status still holds the old sandbox's IP; the CNI chain
    returned the new one (Istio's AddPodToMesh takes prevResult's IPs)."""
    rig = Rig(tmp_path, pod(ips=("10.0.0.9",)))
    reply = rig.handlers.add(rig.body(ip="10.0.0.5"))
    assert reply.status == 200, reply.body
    assert rig.host.entries == {"uid-1": {"10.0.0.5"}}


def test_a_recreated_sandbox_moves_the_probe_entry_to_its_ip(tmp_path: Path) -> None:
    rig = Rig(tmp_path, new_pod())
    second = tmp_path / "cni-2"
    second.touch()
    assert rig.handlers.add(rig.body()).status == 200
    reply = rig.handlers.add(rig.body(sandbox="c2", netns=second, ip="10.0.0.6"))
    assert reply.status == 200, reply.body
    assert rig.host.entries == {"uid-1": {"10.0.0.6"}}


def test_a_stale_sandboxs_del_after_the_new_add_leaves_the_pod_in_ztunnel(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path, new_pod())
    second = tmp_path / "cni-2"
    second.touch()
    assert rig.handlers.add(rig.body()).status == 200
    assert rig.handlers.add(rig.body(sandbox="c2", netns=second, ip="10.0.0.6")).status == 200
    rig.handlers.delete(rig.body("DEL"))  # the old sandbox, torn down late
    assert "uid-1" in rig.ztunnel.workloads and rig.mesh.state("uid-1") == "enabled"
    assert rig.host.entries == {"uid-1": {"10.0.0.6"}}
    rig.handlers.delete(rig.body("DEL", sandbox="c2", netns=second, ip="10.0.0.6"))
    assert "uid-1" not in rig.ztunnel.workloads and rig.mesh.state("uid-1") == "none"


# -- one DelWorkload per removal: the CNI DEL and the pod's delete event ---------------------------


def watch_of(rig: Rig) -> AmbientWatch:
    """The agent's watch on the rig's mesh (the pod's delete event: Istio's only removal)."""

    class Caches:
        def cached(self, namespace: str, name: str) -> dict[str, Any] | None:
            return None  # deleted

        def list_pods(self) -> list[dict[str, Any]]:
            return []

        def cached_namespace(self, name: str) -> dict[str, Any] | None:
            return rig.namespaces.items.get(name)

    return AmbientWatch(
        pods=Caches(),
        namespaces=Caches(),
        mesh=rig.mesh,
        selectors=DEFAULT_ENABLEMENT_SELECTORS,
        exclude_namespaces=["kube-system"],
        system_namespace="istio-system",
    )


def dels(rig: Rig) -> list[tuple[str, ...]]:
    return [e for e in rig.journal if e[0] == "ztunnel.remove"]


@pytest.mark.parametrize("del_first", [True, False], ids=["del-first", "delete-event-first"])
def test_a_running_pod_deleted_gets_one_delworkload_from_its_del_and_delete_event(
    tmp_path: Path, del_first: bool
) -> None:
    """Deleted while running: kubelet tears its sandbox down (CNI DEL) and the watch sees it
    deleted, in either order. Istio sends one DelWorkload (its DEL does nothing); so does this
    agent, the sandbox re-created or not."""
    rig = Rig(tmp_path, new_pod())
    second = tmp_path / "cni-2"
    second.touch()
    assert rig.handlers.add(rig.body()).status == 200
    rig.handlers.delete(rig.body("DEL"))  # kubelet re-creates the sandbox
    assert rig.handlers.add(rig.body(sandbox="c2", netns=second, ip="10.0.0.6")).status == 200
    assert dels(rig) == [("ztunnel.remove", "uid-1")]
    rig.journal.clear()
    running = pod(ips=("10.0.0.6",))
    steps = [
        lambda: rig.handlers.delete(rig.body("DEL", sandbox="c2", netns=second, ip="10.0.0.6")),
        lambda: watch_of(rig).handle(Event("pod", "delete", running, None)),
    ]
    for step in steps if del_first else reversed(steps):
        step()
    assert dels(rig) == [("ztunnel.remove", "uid-1")]
    assert rig.mesh.state("uid-1") == "none" and rig.host.entries == {}


def test_a_terminated_pods_delete_event_sends_its_delworkload_as_istio_does(
    tmp_path: Path,
) -> None:
    """A pod that completed: its sandbox's DEL released it (Istio: its update to Succeeded
    does); when it is deleted later Istio sends DelWorkload again, and so does this agent."""
    rig = Rig(tmp_path, new_pod())
    assert rig.handlers.add(rig.body()).status == 200
    rig.handlers.delete(rig.body("DEL"))
    watch_of(rig).handle(Event("pod", "delete", pod(phase="Succeeded"), None))
    assert dels(rig) == [("ztunnel.remove", "uid-1")] * 2


def test_a_pod_the_agent_does_not_know_still_gets_its_delworkload(tmp_path: Path) -> None:
    """Enrolled by an agent before a restart that did not find it (or deleted while the agent
    was down): ztunnel may hold it, so its delete event sends DelWorkload (Istio: the pod
    matches the enablement selectors)."""
    rig = Rig(tmp_path)
    watch_of(rig).handle(Event("pod", "delete", pod(), None))
    assert dels(rig) == [("ztunnel.remove", "uid-1")]


# -- a namespace cache behind the API server -------------------------------------------------------


def test_a_namespace_labelled_before_the_cache_saw_it_captures_the_pod(tmp_path: Path) -> None:
    """The cache still has `plain` without the label; the API server has it: Istio's plugin
    GETs the namespace, and so does the ADD when the cache says "not ambient"."""
    rig = Rig(tmp_path, new_pod("web-0", "plain"))
    rig.namespaces.api["plain"] = namespace("plain", AMBIENT)
    reply = rig.handlers.add(rig.body(ns="plain"))
    assert reply.result == wire.RESULT_REDIRECTED, reply.body
    assert rig.namespaces.reads == ["plain"] and "uid-1" in rig.ztunnel.workloads


def test_the_namespace_read_failing_fails_the_add_closed(tmp_path: Path) -> None:
    rig = Rig(tmp_path, new_pod("web-0", "plain"))
    rig.namespaces.read_error = RuntimeError("API server away")
    reply = rig.handlers.add(rig.body(ns="plain"))
    assert reply.status != 200 and "API server away" in str(reply.body)
    assert rig.mesh.snapshot() == []


@pytest.mark.parametrize(
    ("the_pod", "ns"),
    [
        (new_pod("web-0", "app"), "app"),  # the cache says ambient: no read needed
        (new_pod("web-0", "plain", labels={"istio.io/dataplane-mode": "none"}), "plain"),
        (new_pod("web-0", "kube-system"), "kube-system"),  # excluded
    ],
    ids=["cached-ambient", "opted-out", "excluded"],
)
def test_no_read_when_the_namespace_cannot_change_the_verdict(
    tmp_path: Path, the_pod: dict[str, Any], ns: str
) -> None:
    rig = Rig(tmp_path, the_pod)
    rig.namespaces.items["kube-system"] = namespace("kube-system", AMBIENT)
    rig.handlers.add(rig.body(ns=ns))
    assert rig.namespaces.reads == []
