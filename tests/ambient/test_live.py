"""Live enrollment on the real kube-apiserver with real pod netns, the real ambient rules and the
ztunnel test double: labels enroll and release running pods (annotation through the API, rules
in the netns, workload in ztunnel, IP in the node's probe set), an agent restart keeps pods
captured without duplicate rules, a pod deleted while ztunnel is away is released, a CNI ADD
through the agent's real pod server enrolls an ambient pod, and a pod deleted after its sandbox
was re-created gets one DelWorkload from its last sandbox's DEL and its delete event together.

The "node" is a netns of the test (host probe rules go there, never into the machine's own).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from agent.ambient.enroller import AmbientEnroller
from agent.ambient.mesh import MeshDataplane, StatusAnnotator, rule_options_for
from agent.ambient.service import AmbientService
from agent.ambient.watch import AmbientWatch
from agent.ambient.zds import ZdsServer
from agent.config import AmbientSettings, Settings
from agent.label_selectors import DEFAULT_ENABLEMENT_SELECTORS
from agent.netns.look import netns_addresses
from agent.podnetns.finder import PodNetnsFinder
from agent.pods.namespaces import NamespaceCache
from agent.pods.pod_cache import PodCache
from agent.podserver.service import PodService
from agent.rules.ambient.apply import HostProbeRules, InpodRules
from agent.rules.ambient.options import PodRuleOptions
from plugin import wire
from testbed import kubepods, netns
from testbed.kubepods import wait_for
from testbed.node import NodePods
from testbed.podnet import saved_rules
from testbed.podnetns import PodNamespaces
from testbed.ztunnel_double import ZtunnelDouble, api_identity
from tests.podserver.helpers import call

pytestmark = pytest.mark.ambient

AMBIENT = {"istio.io/dataplane-mode": "ambient"}
ANNOTATION = "ambient.istio.io/redirection"
_ips = itertools.count(10)


class Bed:
    """One agent's ambient half (no install, no sidecar path) against the test bed."""

    def __init__(self, core: Any, node: str, tmp: Path, node_netns: str) -> None:
        self.core, self.node, self.tmp = core, node, tmp
        self.settings = AmbientSettings(enabled=True, ztunnelSocketPath=str(tmp / "zds.sock"))
        self.host = HostProbeRules(node_netns, ipv6=False)
        self.service: AmbientService | None = None
        self.watched: list[str] = []
        """The type of each pod or namespace event the watch began to handle."""

    def start(self) -> AmbientService:
        pods = PodCache(self.core, self.node)
        namespaces = NamespaceCache(self.core, self.node)
        ztunnel = ZdsServer(self.settings.ztunnelSocketPath)
        self.mesh = MeshDataplane(
            pod_rules=InpodRules(),
            host_rules=self.host,
            ztunnel=ztunnel,
            annotator=StatusAnnotator(self.core),
            find_netns=PodNetnsFinder(
                proc_dir="/proc", netns_dir="/run/netns", read_addresses=netns_addresses
            ),
            options_for=rule_options_for(PodRuleOptions(ipv6=False)),
        )
        watch = self.watch = AmbientWatch(
            pods=pods,
            namespaces=namespaces,
            mesh=self.mesh,
            selectors=DEFAULT_ENABLEMENT_SELECTORS,
            exclude_namespaces=["kube-system"],
            system_namespace="istio-system",
            on_event=self.watched.append,
        )
        self.service = AmbientService(
            settings=self.settings,
            pods=pods,
            namespaces=namespaces,
            mesh=self.mesh,
            ztunnel=ztunnel,
            watch=watch,
            start_pod_cache=True,
        )
        self.service.start()
        wait_for(self.service.ready, "ambient service ready (ZDS listening)", timeout=30)
        return self.service

    def wait_handled(self, event_type: str = "") -> None:
        """Until the watch has handled every event it began, one of `event_type` among them,
        and has none waiting."""
        wait_for(
            lambda: (
                (not event_type or event_type in self.watched)
                and self.watch.processed == len(self.watched)
                and self.watch.pending() == 0
            ),
            f"the watch to handle {'a ' + event_type if event_type else 'each'} event",
            timeout=30,
        )

    def stop(self) -> None:
        if self.service is not None:
            self.service.stop()
            self.service = None


@pytest.fixture
def node_netns() -> Iterator[str]:
    name = netns.unique_name("amb-node")
    netns.add(name)
    try:
        yield f"/run/netns/{name}"
    finally:
        netns.delete(name)


@pytest.fixture
def bed(kube_core: Any, sim_node: str, tmp_path: Path, node_netns: str) -> Iterator[Bed]:
    made = Bed(kube_core, sim_node, tmp_path, node_netns)
    try:
        yield made
    finally:
        made.stop()


@pytest.fixture
def ztunnel(bed: Bed) -> Iterator[ZtunnelDouble]:
    with ZtunnelDouble(bed.settings.ztunnelSocketPath, identity=api_identity(bed.core)) as double:
        yield double


@pytest.fixture
def namespace(kube_core: Any) -> Iterator[str]:
    with kubepods.temporary_namespace(kube_core, netns.unique_name("amb")) as name:
        yield name


def running_pod(
    node_pods: NodePods, pod_namespaces: PodNamespaces, namespace: str, name: str, **options: Any
) -> tuple[dict[str, Any], str]:
    """An API pod reported Running with an IP that a real netns of ours holds, with a sandbox
    process in it that is in the pod's cgroup (how the agent tells the pod's netns)."""
    ip = f"10.77.{next(_ips)}.5"
    ns_name = Path(pod_namespaces.netns()).name
    netns.ip("link", "add", "eth0", "type", "veth", "peer", "name", "peer0", netns=ns_name)
    netns.ip("addr", "add", f"{ip}/24", "dev", "eth0", netns=ns_name)
    netns.ip("link", "set", "eth0", "up", netns=ns_name)
    created = node_pods.create(namespace, name, **options)
    uid = created["metadata"]["uid"]
    SANDBOX_PIDS[uid] = pod_namespaces.sandboxes.start(f"/run/netns/{ns_name}", uid)
    return node_pods.set_running(namespace, name, ip), ns_name


SANDBOX_PIDS: dict[str, int] = {}
"""Pod UID -> its sandbox process (the agent finds the pod's netns through it)."""


def annotation(core: Any, namespace: str, name: str) -> str | None:
    pod = core.read_namespaced_pod(name, namespace)
    return (pod.metadata.annotations or {}).get(ANNOTATION)


def label_namespace(core: Any, namespace: str, labels: Mapping[str, str | None]) -> None:
    core.patch_namespace(namespace, {"metadata": {"labels": labels}})


def rules_of(ns_name: str) -> list[str]:
    """The pod's saved rules without comments and packet counters (they change by themselves)."""
    return [
        re.sub(r"\[\d+:\d+\]", "", line)
        for line in saved_rules(ns_name).splitlines()
        if not line.startswith("#")
    ]


def inpod_chains(ns_name: str) -> int:
    """How many times ambient's chains are declared in the pod's saved rules (0: not captured)."""
    saved = saved_rules(ns_name)
    return saved.count(":ISTIO_OUTPUT ") + saved.count(":ISTIO_PRERT ")


def test_namespace_label_enrolls_and_releases_running_pods(
    bed: Bed,
    ztunnel: ZtunnelDouble,
    kube_core: Any,
    node_pods: NodePods,
    pod_namespaces: PodNamespaces,
    namespace: str,
) -> None:
    pod, ns_name = running_pod(node_pods, pod_namespaces, namespace, "web")
    _opted_out, out_ns = running_pod(
        node_pods, pod_namespaces, namespace, "quiet", labels={"istio.io/dataplane-mode": "none"}
    )
    bed.start()
    ztunnel.connect()
    uid, ip = pod["metadata"]["uid"], pod["status"]["podIP"]

    label_namespace(kube_core, namespace, AMBIENT)
    wait_for(lambda: annotation(kube_core, namespace, "web") == "enabled", "annotation enabled")
    assert inpod_chains(ns_name) > 0
    assert uid in ztunnel.workloads()
    assert bed.host.entries().get(ip) == uid
    assert annotation(kube_core, namespace, "quiet") is None and inpod_chains(out_ns) == 0

    label_namespace(kube_core, namespace, {"istio.io/dataplane-mode": None})
    wait_for(lambda: annotation(kube_core, namespace, "web") is None, "annotation removed")
    assert inpod_chains(ns_name) == 0
    ztunnel.wait_for("workload deleted", lambda z: uid not in z.workloads())
    assert ip not in bed.host.entries()


def test_pod_label_enrolls_and_opt_out_releases(
    bed: Bed,
    ztunnel: ZtunnelDouble,
    kube_core: Any,
    node_pods: NodePods,
    pod_namespaces: PodNamespaces,
    namespace: str,
) -> None:
    _pod, ns_name = running_pod(node_pods, pod_namespaces, namespace, "web")
    bed.start()
    ztunnel.connect()
    kube_core.patch_namespaced_pod("web", namespace, {"metadata": {"labels": AMBIENT}})
    wait_for(lambda: annotation(kube_core, namespace, "web") == "enabled", "annotation enabled")
    assert inpod_chains(ns_name) > 0
    kube_core.patch_namespaced_pod(
        "web", namespace, {"metadata": {"labels": {"istio.io/dataplane-mode": "none"}}}
    )
    wait_for(lambda: annotation(kube_core, namespace, "web") is None, "annotation removed")
    assert inpod_chains(ns_name) == 0
    # Back in, same sandbox: released properly (rules first), the pod may come back.
    kube_core.patch_namespaced_pod("web", namespace, {"metadata": {"labels": AMBIENT}})
    wait_for(lambda: annotation(kube_core, namespace, "web") == "enabled", "enabled again")
    assert inpod_chains(ns_name) > 0


def test_agent_restart_keeps_pods_captured_without_duplicates(
    bed: Bed,
    ztunnel: ZtunnelDouble,
    kube_core: Any,
    node_pods: NodePods,
    pod_namespaces: PodNamespaces,
    namespace: str,
) -> None:
    label_namespace(kube_core, namespace, AMBIENT)
    pod, ns_name = running_pod(node_pods, pod_namespaces, namespace, "web")
    uid = pod["metadata"]["uid"]
    bed.start()  # a running pod of an ambient namespace is enrolled live at start
    ztunnel.connect()
    wait_for(lambda: annotation(kube_core, namespace, "web") == "enabled", "annotation enabled")
    before = rules_of(ns_name)

    bed.stop()  # a plain restart: pods stay enrolled
    ztunnel.wait_disconnected()
    assert inpod_chains(ns_name) > 0 and annotation(kube_core, namespace, "web") == "enabled"
    service = bed.start()
    ztunnel.connect()
    assert service.reconciled is not None
    assert service.reconciled.found == [uid] and service.reconciled.reapplied == []
    ztunnel.wait_for("snapshot with the pod", lambda z: uid in z.workloads())
    assert rules_of(ns_name) == before  # no duplicate, nothing rewritten


def test_a_pod_whose_netns_is_not_found_at_restart_stays_in_ztunnel(
    bed: Bed,
    ztunnel: ZtunnelDouble,
    kube_core: Any,
    node_pods: NodePods,
    pod_namespaces: PodNamespaces,
    namespace: str,
) -> None:
    """After an agent restart an enrolled pod's netns is not found (its sandbox process is not
    there to find it by): ztunnel, which did not restart, gets KeepWorkload for it, as from
    Istio, and does not delete it at SnapshotSent while its in-pod rules still redirect to it;
    once the netns can be found again the pod is handed over with it."""
    label_namespace(kube_core, namespace, AMBIENT)
    pod, ns_name = running_pod(node_pods, pod_namespaces, namespace, "web")
    uid = pod["metadata"]["uid"]
    bed.start()
    ztunnel.connect()
    wait_for(lambda: annotation(kube_core, namespace, "web") == "enabled", "annotation enabled")
    bed.stop()
    ztunnel.wait_disconnected()
    pod_namespaces.sandboxes.stop(SANDBOX_PIDS[uid])
    service = bed.start()
    ztunnel.connect()
    ztunnel.wait_for("the second snapshot", lambda z: z.snapshots >= 2)
    assert uid in ztunnel.workloads() and inpod_chains(ns_name) > 0
    assert ("keep", uid, False) in ztunnel.requests
    assert service.reconciled is not None and service.reconciled.kept == [uid]
    SANDBOX_PIDS[uid] = pod_namespaces.sandboxes.start(f"/run/netns/{ns_name}", uid)
    wait_for(lambda: bed.mesh.state(uid) == "enabled", "the pod found and handed over again")
    assert ztunnel.requests[-1][:2] == ("add", uid)


def test_pod_deleted_while_ztunnel_is_away(
    bed: Bed,
    ztunnel: ZtunnelDouble,
    kube_core: Any,
    node_pods: NodePods,
    pod_namespaces: PodNamespaces,
    namespace: str,
) -> None:
    label_namespace(kube_core, namespace, AMBIENT)
    pod, _ = running_pod(node_pods, pod_namespaces, namespace, "web")
    uid, ip = pod["metadata"]["uid"], pod["status"]["podIP"]
    bed.start()
    ztunnel.connect()
    wait_for(lambda: annotation(kube_core, namespace, "web") == "enabled", "annotation enabled")
    ztunnel.disconnect()
    node_pods.delete(namespace, "web")
    assert bed.service is not None
    wait_for(lambda: bed.mesh.enrolled(uid) is None, "pod released from the enrolled set")
    assert ip not in bed.host.entries()
    ztunnel.connect()  # a fresh snapshot without the deleted pod
    ztunnel.wait_for("snapshot", lambda z: z.snapshots >= 2)
    assert uid not in ztunnel.workloads()


def pod_server(kube_core: Any, sim_node: str, bed: Bed, tmp_path: Path) -> tuple[PodService, str]:
    """The agent's real pod server, its ambient side on the bed's mesh, and its socket."""
    enroller = AmbientEnroller(
        namespaces=NamespaceCache(kube_core, sim_node),
        mesh=bed.mesh,
        selectors=DEFAULT_ENABLEMENT_SELECTORS,
        exclude_namespaces=["kube-system"],
        system_namespace="istio-system",
        detection_retry=True,
    )
    settings = replace(Settings(), cniAgentRunDir=str(tmp_path / "run"))
    server = PodService(
        settings,
        sim_node,
        lambda: None,  # type: ignore[arg-type,return-value]
        install_ready=lambda: True,
        ambient=enroller,
        cache=PodCache(kube_core, sim_node),
    )
    return server, settings.socket_path


def cni(
    socket: str, command: str, sandbox: str, ns_name: str, namespace: str, ip: str
) -> dict[str, Any]:
    """One CNI request for pod `fresh` through the pod server's socket; its reply."""
    body = wire.encode(
        wire.cni_request(
            command=command,
            container_id=sandbox,
            netns=f"/run/netns/{ns_name}",
            ifname="eth0",
            pod_name="fresh",
            pod_namespace=namespace,
            pod_uid="",
            cni_version="1.0.0",
            prev_result={"ips": [{"address": f"{ip}/24"}]},
        )
    )
    status, reply = call(socket, "POST", wire.COMMAND_PATHS[command], body)
    assert status == 200, reply
    return dict(reply)


def test_cni_add_of_ambient_pod_through_the_pod_server(
    bed: Bed,
    ztunnel: ZtunnelDouble,
    kube_core: Any,
    sim_node: str,
    node_pods: NodePods,
    pod_namespaces: PodNamespaces,
    namespace: str,
    tmp_path: Path,
) -> None:
    label_namespace(kube_core, namespace, AMBIENT)
    service = bed.start()
    ztunnel.connect()
    ns_name = Path(pod_namespaces.netns()).name
    pod = node_pods.create(namespace, "fresh")  # no IP yet: the ADD brings it
    server, socket = pod_server(kube_core, sim_node, bed, tmp_path)
    server.start()
    try:
        reply = cni(socket, "ADD", "c-fresh", ns_name, namespace, "10.77.250.9")
        assert reply["result"] == wire.RESULT_REDIRECTED
        assert annotation(kube_core, namespace, "fresh") == "enabled"
        assert inpod_chains(ns_name) > 0
        assert pod["metadata"]["uid"] in ztunnel.workloads()
        assert bed.host.entries().get("10.77.250.9") == pod["metadata"]["uid"]
        assert service.ready()
    finally:
        server.stop()


@contextmanager
def a_pod_with_two_sandboxes(
    bed: Bed,
    ztunnel: ZtunnelDouble,
    kube_core: Any,
    sim_node: str,
    node_pods: NodePods,
    pod_namespaces: PodNamespaces,
    namespace: str,
    tmp_path: Path,
) -> Iterator[tuple[str, str, str, str]]:
    """An ambient namespace with the bed started and ztunnel connected, a pod `fresh` in it and
    two network namespaces for its sandboxes: (its UID, the old netns, the new netns, the pod
    server's socket); the pod server stopped on exit."""
    label_namespace(kube_core, namespace, AMBIENT)
    bed.start()
    ztunnel.connect()
    old_ns, new_ns = (Path(pod_namespaces.netns()).name for _ in range(2))
    uid = node_pods.create(namespace, "fresh")["metadata"]["uid"]
    server, socket = pod_server(kube_core, sim_node, bed, tmp_path)
    server.start()
    try:
        yield uid, old_ns, new_ns, socket
    finally:
        server.stop()


def test_a_stale_sandboxs_del_leaves_the_pod_in_ztunnel_and_its_new_ip_probed(
    bed: Bed,
    ztunnel: ZtunnelDouble,
    kube_core: Any,
    sim_node: str,
    node_pods: NodePods,
    pod_namespaces: PodNamespaces,
    namespace: str,
    tmp_path: Path,
) -> None:
    """The runtime re-creates the pod's sandbox: the new sandbox's ADD comes before the old
    one's DEL, and the pod's status still holds the old IP. The pod stays in ztunnel with its
    new netns, the probe set holds the new IP and not the old one."""
    fixtures = (bed, ztunnel, kube_core, sim_node, node_pods, pod_namespaces, namespace, tmp_path)
    with a_pod_with_two_sandboxes(*fixtures) as (uid, old_ns, new_ns, socket):
        cni(socket, "ADD", "c-old", old_ns, namespace, "10.77.251.1")
        node_pods.set_running(namespace, "fresh", "10.77.251.1")
        cni(socket, "ADD", "c-new", new_ns, namespace, "10.77.251.2")
        cni(socket, "DEL", "c-old", old_ns, namespace, "10.77.251.1")
        held = ztunnel.wait_for("the pod in ztunnel", lambda z: z.workloads().get(uid))
        assert held is not None
        assert held.netns_inode == (Path("/run/netns") / new_ns).stat().st_ino
        assert uid in ztunnel.workloads() and bed.mesh.state(uid) == "enabled"
        entries = bed.host.entries()
        assert entries.get("10.77.251.2") == uid and "10.77.251.1" not in entries


@pytest.mark.parametrize("del_first", [True, False], ids=["del-first", "delete-event-first"])
def test_a_pod_deleted_after_its_sandbox_was_recreated_gets_one_delworkload(
    bed: Bed,
    ztunnel: ZtunnelDouble,
    kube_core: Any,
    sim_node: str,
    node_pods: NodePods,
    pod_namespaces: PodNamespaces,
    namespace: str,
    tmp_path: Path,
    del_first: bool,
) -> None:
    """kubelet re-creates a running pod's sandbox (the old one's DEL, then the new one's ADD),
    and the pod is deleted later: its new sandbox's DEL and its delete event come in either
    order, and ztunnel gets one DelWorkload for the deletion, as from Istio's agent. ztunnel
    acks a DelWorkload for a pod it no longer holds, so the stream itself is compared."""
    fixtures = (bed, ztunnel, kube_core, sim_node, node_pods, pod_namespaces, namespace, tmp_path)
    with a_pod_with_two_sandboxes(*fixtures) as (uid, old_ns, new_ns, socket):
        cni(socket, "ADD", "c-old", old_ns, namespace, "10.77.252.1")
        node_pods.set_running(namespace, "fresh", "10.77.252.1")
        cni(socket, "DEL", "c-old", old_ns, namespace, "10.77.252.1")
        cni(socket, "ADD", "c-new", new_ns, namespace, "10.77.252.2")
        assert bed.mesh.state(uid) == "enabled"
        # The watch may have decided on the pod between the two sandboxes (nothing to do, or an
        # enrollment of its netns): done before the deletion starts.
        bed.wait_handled()
        sent = len(ztunnel.stream)

        def last_del() -> None:
            cni(socket, "DEL", "c-new", new_ns, namespace, "10.77.252.2")

        def delete_event() -> None:
            node_pods.delete(namespace, "fresh")
            bed.wait_handled("delete")

        for step in (last_del, delete_event) if del_first else (delete_event, last_del):
            step()
        told = [(m.kind, m.uid) for m in ztunnel.stream[sent:]]
        assert told == [("del", uid)], told
        assert uid not in ztunnel.workloads() and bed.mesh.state(uid) == "none"
        assert uid not in bed.host.entries().values()


def test_ztunnel_gets_the_pods_own_service_account(
    bed: Bed,
    ztunnel: ZtunnelDouble,
    kube_core: Any,
    node_pods: NodePods,
    pod_namespaces: PodNamespaces,
    namespace: str,
) -> None:
    """ztunnel finds the pod's workload and issues its certificate by namespace and service
    account; the double compares each WorkloadInfo with the API server's pod."""
    kube_core.create_namespaced_service_account(namespace, {"metadata": {"name": "payments"}})
    label_namespace(kube_core, namespace, AMBIENT)
    pod, _ = running_pod(node_pods, pod_namespaces, namespace, "web", service_account="payments")
    bed.start()
    ztunnel.connect()
    uid = pod["metadata"]["uid"]
    held = ztunnel.wait_for("the pod in ztunnel", lambda z: z.workloads().get(uid))
    assert held is not None and held.service_account == "payments"
