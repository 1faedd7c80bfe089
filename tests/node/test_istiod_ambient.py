"""Ambient mode with the real istiod: Istio's `base` and `istiod` charts with `profile=ambient`
(PILOT_ENABLE_AMBIENT), this chart with `profile=ambient` (the ztunnel TEST DOUBLE of
testbed/ztunnel_double.py on its ZDS socket: ztunnel cannot run here). A pod that kubelet starts
in a namespace labelled `istio.io/dataplane-mode=ambient` is enrolled by the agent, which writes
`ambient.istio.io/redirection: enabled` on it; istiod, reading that annotation as Istio's own
agent writes it, then serves the pod to ztunnel as an HBONE workload (its `/debug/ambientz`,
the workloads it would send over WDS). A pod of a plain namespace is served without a tunnel.
Releasing the pod (the label removed) takes the annotation away and istiod follows. Pods with
their own ServiceAccounts are served each under its own, and again so after each fault (the
agent's container killed, its pod deleted, ztunnel restarted, a sandbox killed,
tests/node/zds_faults.py's full probe set and refused annotation, the annotation removed by
hand). A module of its own: its istiod runs with other values than tests/node/test_istiod.py's.
On containerd 2, the node laid out as kind's (tests/node/conftest.py on_containerd2)."""

from __future__ import annotations

import base64
import http.client
import ipaddress
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from testbed import chart as agent_mod
from testbed import kubepods
from testbed.images import Image
from testbed.istiod import Istiod
from testbed.realnode import RealCluster
from testbed.ztunnel_double import ZtunnelDouble, api_identity
from tests.node.conftest import istiod_running
from tests.node.zds_faults import (
    FAULT_LABEL,
    IPSET_ERR_HASH_FULL,
    REFUSAL,
    annotation_refused,
    probe_set_full,
)
from tests.node.zds_scenario import kill_pods, reconnect

pytestmark = [pytest.mark.node, pytest.mark.istiod, pytest.mark.usefixtures("on_containerd2")]

MODE_LABEL = "istio.io/dataplane-mode"
ANNOTATION = "ambient.istio.io/redirection"
AMBIENT = {"profile": "ambient"}


@pytest.fixture(scope="module")
def ambient_istiod(
    real_cluster: RealCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Istiod]:
    workdir = tmp_path_factory.mktemp("istiod-ambient")
    with istiod_running(real_cluster, workdir, values=AMBIENT, base_values=AMBIENT) as control:
        yield control


@pytest.fixture
def plain_ns(node_core: Any) -> Iterator[str]:
    with kubepods.pod_namespace(node_core, "plain") as name:
        yield name


def served_workloads(istiod: Istiod) -> dict[tuple[str, str], dict[str, Any]]:
    """(namespace, name) -> the pod's workload as istiod would serve it to ztunnel (from its
    /debug/ambientz)."""
    conn = http.client.HTTPConnection("127.0.0.1", istiod.ports.http, timeout=5)
    try:
        conn.request("GET", "/debug/ambientz")
        response = conn.getresponse()
        body = response.read()
    finally:
        conn.close()
    assert response.status == 200, (response.status, body[:500])
    return {
        (str(w.get("namespace")), str(w.get("name"))): w
        for w in json.loads(body).get("workloads") or []
    }


def served_workload(istiod: Istiod, namespace: str, name: str) -> dict[str, Any] | None:
    """The pod as istiod would serve it to ztunnel, or None."""
    return served_workloads(istiod).get((namespace, name))


def tunnel(istiod: Istiod, namespace: str, name: str) -> str | None:
    """The tunnel istiod gives the pod's workload ("NONE" when it has none), None while it has
    no workload for it."""
    workload = served_workload(istiod, namespace, name)
    return None if workload is None else str(workload.get("tunnelProtocol") or "NONE")


def annotation(core: Any, namespace: str, name: str) -> str | None:
    value: str | None = (core.read_namespaced_pod(name, namespace).metadata.annotations or {}).get(
        ANNOTATION
    )
    return value


def test_istiod_serves_the_pods_the_agent_enrolls_over_hbone(
    real_cluster: RealCluster,
    ztunnel_socket: Path,
    node_helm: Any,
    node_core: Any,
    agent_image: Image,
    ambient_istiod: Istiod,
    workload_ns: str,
    plain_ns: str,
) -> None:
    istiod = ambient_istiod
    node_core.patch_namespace(workload_ns, {"metadata": {"labels": {MODE_LABEL: "ambient"}}})
    agent_mod.install(
        node_helm("4"),
        real_cluster,
        node_core,
        agent_image,
        profile="ambient",
        ambient={"ztunnelSocketPath": str(ztunnel_socket)},
    )
    with ZtunnelDouble(str(ztunnel_socket), identity=api_identity(node_core)) as ztunnel:
        ztunnel.connect()
        image = real_cluster.images["workload"].ref
        for ns in (workload_ns, plain_ns):
            manifest = kubepods.pod_manifest("web", image, app_command=["sleep"], sidecar=False)
            node_core.create_namespaced_pod(ns, manifest)
        meshed = kubepods.wait_running(node_core, workload_ns, "web")
        kubepods.wait_running(node_core, plain_ns, "web")
        assert annotation(node_core, workload_ns, "web") == "enabled"
        assert meshed.uid in ztunnel.workloads(), ztunnel.requests

        kubepods.wait_for(
            lambda: tunnel(istiod, workload_ns, "web") == "HBONE",
            "istiod to serve the enrolled pod over HBONE",
            60,
            on_timeout=lambda: (
                f"{served_workload(istiod, workload_ns, 'web')}\n" + istiod.log()[-3000:]
            ),
        )
        served = served_workload(istiod, workload_ns, "web")
        assert served is not None, served
        assert served.get("uid") == f"Kubernetes//Pod/{workload_ns}/web", (
            served
        )  # cluster ID Kubernetes
        kubepods.wait_for(
            lambda: tunnel(istiod, plain_ns, "web"), "istiod's workload of the plain pod", 60
        )
        assert tunnel(istiod, plain_ns, "web") == "NONE"

        # Released: the agent takes its annotation away and istiod serves it without a tunnel.
        node_core.patch_namespace(workload_ns, {"metadata": {"labels": {MODE_LABEL: None}}})
        kubepods.wait_for(
            lambda: annotation(node_core, workload_ns, "web") is None, "the pod released", 30
        )
        kubepods.wait_for(
            lambda: tunnel(istiod, workload_ns, "web") == "NONE",
            "istiod to serve the released pod without a tunnel",
            60,
        )


OWN_ACCOUNT_PODS = 4
VIEW_BOUND = 60.0
"""Seconds each fault may take until istiod's and ztunnel's view of the pods is right again."""


def wrong_in_view(
    core: Any,
    cluster: RealCluster,
    istiod: Istiod,
    ztunnel: ZtunnelDouble,
    namespace: str,
    accounts: dict[str, str],
) -> list[str]:
    """What is not right yet about the pods `accounts` (name -> its own ServiceAccount): each
    annotated `enabled`, served by istiod over HBONE under its own account, and held by the
    ztunnel double with that account and its current sandbox's netns. Empty once right."""
    wrong: list[str] = []
    served = served_workloads(istiod)
    held = ztunnel.workloads()
    for name, account in accounts.items():
        pod = core.read_namespaced_pod(name, namespace)
        uid = pod.metadata.uid
        note = (pod.metadata.annotations or {}).get(ANNOTATION)
        if note != "enabled":
            wrong.append(f"{name}: annotation {note!r}")
        workload = served.get((namespace, name)) or {}
        seen = (workload.get("tunnelProtocol"), workload.get("serviceAccount"))
        if seen != ("HBONE", account):
            wrong.append(f"{name}: istiod serves (tunnel, account) {seen}, want HBONE, {account}")
        if pod.status.pod_ip not in addresses(workload):
            wrong.append(f"{name}: istiod serves {addresses(workload)}, not {pod.status.pod_ip}")
        taken = held.get(uid)
        if taken is None or taken.service_account != account:
            wrong.append(f"{name}: ztunnel holds {taken and taken.service_account!r}")
        elif taken.netns_inode != sandbox_netns(cluster, uid):
            wrong.append(f"{name}: ztunnel holds another netns than its running sandbox's")
    return wrong


def addresses(workload: dict[str, Any]) -> set[str]:
    """The workload's addresses as text. /debug/ambientz gives each in base64: of the address's
    text (as istiod's debug JSON renders it here), or of its bytes (the proto's)."""
    out = set()
    for raw in workload.get("addresses") or []:
        decoded = base64.b64decode(raw)
        packed = len(decoded) in (4, 16)
        out.add(str(ipaddress.ip_address(decoded if packed else decoded.decode())))
    return out


def sandbox_netns(cluster: RealCluster, uid: str) -> int | None:
    """The inode of the netns of the pod's running sandbox, None while it has none."""
    pid = cluster.cri.sandbox_pid(uid)
    try:
        return None if pid is None else os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:  # the process just went (the sandbox killed)
        return None


def agent_restarts(core: Any, name: str, *, ready: bool = False) -> int:
    """The restart count of the agent pod `name`'s container (-1 when `ready` and it is not)."""
    pod = core.read_namespaced_pod(name, agent_mod.AGENT_NAMESPACE)
    for status in pod.status.container_statuses or []:
        if status.name == agent_mod.AGENT_CONTAINER and (status.ready or not ready):
            return int(status.restart_count)
    return -1


def wait_sandbox_failed(core: Any, namespace: str, name: str, cause: str) -> None:
    """Until kubelet reports the pod's sandbox failed, naming `cause` (the fault failed it)."""
    uid = core.read_namespaced_pod(name, namespace).metadata.uid
    selector = f"involvedObject.uid={uid},reason=FailedCreatePodSandBox"
    events = kubepods.wait_for(
        lambda: core.list_namespaced_event(namespace, field_selector=selector).items,
        f"{namespace}/{name}'s sandbox failed",
        60,
        interval=0.2,
    )
    assert cause in events[0].message, (name, events[0].message, cause)


def test_istiod_serves_each_pod_under_its_own_account_through_faults(
    real_cluster: RealCluster,
    ztunnel_socket: Path,
    node_helm: Any,
    node_core: Any,
    agent_image: Image,
    ambient_istiod: Istiod,
    workload_ns: str,
) -> None:
    """Pods with their own ServiceAccounts, enrolled: istiod serves each over HBONE under its own
    account, ztunnel holds each with it. After each fault (the agent's container killed, its pod
    deleted, ztunnel restarted, a pod's sandbox killed, the probe set full for a new pod then
    healed, a new pod's annotation refused then allowed, the annotation removed by hand) the
    view is right again within VIEW_BOUND; the seconds each took are printed."""
    istiod, core, ns = ambient_istiod, node_core, workload_ns
    image = real_cluster.images["workload"].ref
    core.patch_namespace(ns, {"metadata": {"labels": {MODE_LABEL: "ambient"}}})
    names = [f"own-{i}" for i in range(OWN_ACCOUNT_PODS)] + ["refused", "full"]
    for name in names:
        body = {"metadata": {"name": f"sa-{name}"}, "automountServiceAccountToken": False}
        core.create_namespaced_service_account(ns, body)
    agent_mod.install(
        node_helm("4"),
        real_cluster,
        core,
        agent_image,
        profile="ambient",
        ambient={"ztunnelSocketPath": str(ztunnel_socket)},
    )

    def create(name: str, labels: dict[str, str] | None = None) -> None:
        body = kubepods.pod_manifest(name, image, app_command=["sleep"], sidecar=False)
        body["metadata"]["labels"].update(labels or {})
        body["spec"]["serviceAccountName"] = f"sa-{name}"
        core.create_namespaced_pod(ns, body)

    accounts: dict[str, str] = {}
    with ZtunnelDouble(str(ztunnel_socket), identity=api_identity(core)) as ztunnel:
        ztunnel.connect()
        print("\nfault -> seconds until istiod's (and ztunnel's) view was right again")

        def right_again(fault: str, began: float) -> None:
            kubepods.wait_for(
                lambda: not wrong_in_view(core, real_cluster, istiod, ztunnel, ns, accounts),
                f"istiod's and ztunnel's view right after: {fault}",
                VIEW_BOUND,
                interval=0.5,
                on_timeout=lambda: (
                    "\n".join(wrong_in_view(core, real_cluster, istiod, ztunnel, ns, accounts))
                    + "\n"
                    + istiod.log()[-2000:]
                ),
            )
            # The table's rows as they come: a later fault's failure shows the earlier ones.
            print(f"  {fault:<56} {time.monotonic() - began:5.1f}")

        began = time.monotonic()
        for name in names[:OWN_ACCOUNT_PODS]:
            create(name)
            accounts[name] = f"sa-{name}"
        for name in accounts:
            kubepods.wait_running(core, ns, name)
        right_again(f"{OWN_ACCOUNT_PODS} pods created", began)
        workloads = ztunnel.workloads()
        for name, account in accounts.items():
            uid = core.read_namespaced_pod(name, ns).metadata.uid
            assert workloads[uid].service_account == account, (name, workloads[uid])
        # Different accounts, so that a view mixing the pods' up shows.
        assert len(set(accounts.values())) == OWN_ACCOUNT_PODS

        began = time.monotonic()
        agent = agent_mod.ready_agent(core, real_cluster).pod
        before = agent_restarts(core, agent.name)
        _, agent_pid = real_cluster.cri.running_container(agent.uid, agent_mod.AGENT_CONTAINER)
        os.kill(agent_pid, signal.SIGKILL)  # kubelet restarts the container in the same pod
        kubepods.wait_for(
            lambda: agent_restarts(core, agent.name, ready=True) > before,
            "the agent's container restarted by kubelet, Ready",
            VIEW_BOUND,
            interval=0.2,
        )
        reconnect(ztunnel)
        right_again("the agent's container killed, kubelet restarted it", began)

        began = time.monotonic()
        kill_pods(core, agent_mod.AGENT_NAMESPACE, agent_mod.AGENT_SELECTOR)
        agent_mod.ready_agent(core, real_cluster, image=agent_image)
        reconnect(ztunnel)  # ztunnel stayed up: it connects to the successor's socket
        right_again("the agent's pod deleted, the DaemonSet made a new one", began)

        began = time.monotonic()
        ztunnel.restart()
        right_again("ztunnel restarted", began)

        began = time.monotonic()
        victim = core.read_namespaced_pod(names[0], ns).metadata.uid
        pid = real_cluster.cri.sandbox_pid(victim)
        assert pid is not None, f"no sandbox of {names[0]}"
        os.kill(pid, signal.SIGKILL)  # kubelet makes a new sandbox, with a new netns
        kubepods.wait_for(  # a new pause process (a netns's inode may be reused at once)
            lambda: real_cluster.cri.sandbox_pid(victim) not in (None, pid),
            f"{names[0]} in a new sandbox",
            VIEW_BOUND,
            interval=0.2,
        )
        right_again(f"{names[0]}'s sandbox killed", began)

        # A new pod's enrollment failing after ztunnel took it (tests/node/zds_faults.py), the
        # fault lifted once kubelet saw the pod's sandbox fail; timed from the lifting.
        with probe_set_full(real_cluster.network.netns_path):
            create("full")
            wait_sandbox_failed(core, ns, "full", str(IPSET_ERR_HASH_FULL))
        accounts["full"] = "sa-full"
        right_again("the probe set full for a new pod, then healed", time.monotonic())
        admission = k8s.AdmissionregistrationV1Api(core.api_client)
        with annotation_refused(admission, core, ns, image):
            create("refused", FAULT_LABEL)
            wait_sandbox_failed(core, ns, "refused", REFUSAL)
        accounts["refused"] = "sa-refused"
        right_again("a new pod's annotation refused, then allowed", time.monotonic())

        began = time.monotonic()
        patched = core.patch_namespaced_pod(
            names[1], ns, {"metadata": {"annotations": {ANNOTATION: None}}}
        )
        assert ANNOTATION not in (patched.metadata.annotations or {}), patched.metadata
        right_again(f"{names[1]}'s annotation removed by hand", began)
