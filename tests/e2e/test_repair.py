"""Repair of pods that started before the plugin was in place (the node-start race), in each of
the chart's modes, with the chart's ClusterRole for that mode only.

Each pod's sandbox goes through the node's CNI chain while the chart is not installed (bridge +
host-local + portmap only, so no rules), the pod is reported as the kubelet would (Running with
its IP; or, as Istio's `istio-validation` init container leaves it, Pending with that container's
last exit code 126), and only then the agent starts and must find and handle it.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import secrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from agent.repair import actions
from testbed import parts
from testbed.cni import CniNode, Sandbox
from testbed.daemon import DaemonAgent
from testbed.helm import Helm
from testbed.node import NodePods, new_core
from testbed.podcgroup import PodSandboxes
from testbed.podnet import connect, has_istio_rules, pod_ip, proxy_in
from testbed.wait import wait_for
from tests.e2e.harness import ChartOnNode
from tests.e2e.scrape import metric_value

pytestmark = [pytest.mark.e2e, pytest.mark.chart, pytest.mark.cluster, pytest.mark.netns]

NAMESPACE = "istio-cni-e2e"
POD_NAMESPACE = "default"
REPAIRED = "istio_cni_repair_pods_repaired_total"
# The repair loop looks every 5 s; a few rounds are allowed.
REPAIR_TIMEOUT = 30.0


@pytest.fixture
def cni_node(tmp_path: Path) -> Iterator[CniNode]:
    """The test bed's CNI node, on a subnet of its own: repair finds pods by address among every
    network namespace of the machine, and other test runs there use the default subnet."""
    try:
        cnitool, plugins = parts.cnitool().require(), parts.cni_plugins_dir()
    except parts.MissingPartError as e:
        pytest.fail(str(e), pytrace=False)
    node = CniNode(
        tmp_path / "cni-node",
        cnitool,
        plugins,
        subnet=f"10.{secrets.randbelow(50) + 200}.{secrets.randbelow(256)}.0/24",
    )
    try:
        node.start()
        yield node
    finally:
        node.close()


@pytest.fixture
def pause_netns() -> Iterator[Any]:
    """pause_netns() -> path /proc/<pid>/ns/net of a new netns held only by a "pause" process
    (no name under /run/netns, as runtimes that keep the sandbox's netns by its process do).
    The processes are killed at the end, and their namespaces go with them."""
    procs: list[subprocess.Popen[bytes]] = []

    def make() -> str:
        proc = subprocess.Popen(["unshare", "--net", "--", "sleep", "infinity"])
        procs.append(proc)
        path = f"/proc/{proc.pid}/ns/net"
        wait_for(
            lambda: os.stat(path).st_ino != os.stat("/proc/self/ns/net").st_ino,
            "the pause process's own netns",
            10,
        )
        subprocess.run(
            ["nsenter", f"--net={path}", "--", "ip", "link", "set", "lo", "up"], check=True
        )
        return path

    yield make
    for proc in procs:
        proc.kill()
        proc.wait()


SIDECAR = {
    "annotations": {"sidecar.istio.io/status": "{}"},
    "init_containers": [{"name": "istio-validation", "image": "proxy"}],
    "containers": [{"name": "app", "image": "app"}, {"name": "istio-proxy", "image": "proxy"}],
}


@pytest.fixture
def pod_sandboxes() -> Iterator[PodSandboxes]:
    """Each simulated pod's sandbox process, in its netns and the pod's cgroup (as a runtime
    leaves them): how the agent tells which netns is the pod's."""
    made = PodSandboxes()
    try:
        yield made
    finally:
        made.close()


def started_before_agent(
    cni_node: CniNode,
    node_pods: NodePods,
    kube_core: Any,
    name: str,
    *,
    sandboxes: PodSandboxes,
    failed_validation: bool,
    sidecar: bool = True,
    netns_path: str | None = None,
) -> tuple[dict[str, Any], Sandbox]:
    """A pod whose sandbox went through the chain without our plugin, now running. With
    `netns_path`, the sandbox is that netns (e.g. a pause process's) instead of a named one."""
    pod = node_pods.create(POD_NAMESPACE, name, **(SIDECAR if sidecar else {}))
    if netns_path is None:
        sandbox = cni_node.new_sandbox(name, POD_NAMESPACE, pod["metadata"]["uid"])
    else:
        sandbox = Sandbox(
            netns_path,
            Path(netns_path),
            name,
            POD_NAMESPACE,
            pod["metadata"]["uid"],
            secrets.token_hex(32),
        )
    ip = pod_ip(cni_node.add(sandbox))
    sandboxes.start(str(sandbox.netns_path), pod["metadata"]["uid"])
    assert not has_istio_rules(sandbox.netns_name)
    pod = node_pods.set_running(POD_NAMESPACE, name, ip)
    if failed_validation:
        pod = report_validation_failed(kube_core, name)
    return pod, sandbox


def report_validation_failed(kube_core: Any, name: str) -> dict[str, Any]:
    """What the kubelet reports when istio-validation found no redirect and exited 126."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    status = {
        "phase": "Pending",
        "conditions": [
            {
                "type": "Initialized",
                "status": "False",
                "lastTransitionTime": now,
                "reason": "ContainersNotInitialized",
            }
        ],
        "initContainerStatuses": [
            {
                "name": "istio-validation",
                "image": "proxy",
                "imageID": "",
                "ready": False,
                "restartCount": 1,
                "started": False,
                "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {
                    "terminated": {
                        "exitCode": 126,
                        "reason": "Error",
                        "startedAt": now,
                        "finishedAt": now,
                    }
                },
            }
        ],
    }
    patched = kube_core.patch_namespaced_pod_status(name, POD_NAMESPACE, {"status": status})
    return dict(kube_core.api_client.sanitize_for_serialization(patched))


def start_agent(chart_on_node: ChartOnNode, helm: Helm, mode: str) -> DaemonAgent:
    installed = chart_on_node.install(helm, NAMESPACE, {"repair": {"mode": mode}})
    agent = chart_on_node.start_agent(installed)
    agent.wait_ready()
    return agent


def events_of(kube_core: Any, pod: dict[str, Any]) -> list[Any]:
    selector = f"involvedObject.uid={pod['metadata']['uid']}"
    return list(kube_core.list_namespaced_event(POD_NAMESPACE, field_selector=selector).items)


def wait_for_event(kube_core: Any, pod: dict[str, Any], reason: str) -> Any:
    found: list[Any] = []

    def seen() -> bool:
        found[:] = [e for e in events_of(kube_core, pod) if e.reason == reason]
        return bool(found)

    wait_for(seen, f"Event {reason} on pod {pod['metadata']['name']}", REPAIR_TIMEOUT)
    event = found[0]
    assert event.type == "Warning"
    assert event.source.component == "istio-cni-repair"
    assert event.involved_object.kind == "Pod"
    return event


def try_call(call: Any, *args: Any, **kwargs: Any) -> int | None:
    """The HTTP status the API server refused the call with; None when it was allowed."""
    try:
        call(*args, **kwargs)
    except ApiException as e:
        return int(e.status)
    return None


@pytest.fixture
def agent_core(chart_on_node: ChartOnNode) -> Iterator[Any]:
    """A CoreV1Api holding the agent pod's token of the chart's ServiceAccount (call after helm
    install)."""
    made: list[Any] = []

    def make() -> Any:
        identity = chart_on_node.identity(NAMESPACE)
        made.append(new_core(str(identity.kubeconfig)))
        return made[-1]

    yield make
    for core in made:
        core.api_client.close()


def test_repair_in_place_programs_running_pods(
    chart_on_node: ChartOnNode,
    helm_releases: Any,
    helm_binaries: dict[str, Any],
    cni_node: CniNode,
    node_pods: NodePods,
    kube_core: Any,
    agent_core: Any,
    pause_netns: Any,
    pod_sandboxes: PodSandboxes,
) -> None:
    helm: Helm = helm_releases(helm_binaries[max(helm_binaries)])
    raced, raced_box = started_before_agent(
        cni_node, node_pods, kube_core, "raced", sandboxes=pod_sandboxes, failed_validation=False
    )
    failing, failing_box = started_before_agent(
        cni_node, node_pods, kube_core, "failing", sandboxes=pod_sandboxes, failed_validation=True
    )
    paused, paused_box = started_before_agent(
        cni_node,
        node_pods,
        kube_core,
        "paused",
        sandboxes=pod_sandboxes,
        failed_validation=False,
        netns_path=pause_netns(),
    )
    _, plain_box = started_before_agent(
        cni_node,
        node_pods,
        kube_core,
        "plain",
        sandboxes=pod_sandboxes,
        failed_validation=False,
        sidecar=False,
    )
    agent = start_agent(chart_on_node, helm, "repair-in-place")

    for pod, box in ((raced, raced_box), (failing, failing_box), (paused, paused_box)):
        wait_for(
            functools.partial(has_istio_rules, box.netns_name),
            f"rules in pod {pod['metadata']['name']}",
            REPAIR_TIMEOUT,
        )
        wait_for_event(kube_core, pod, "RepairBrokenPod")
    ip = raced["status"]["podIP"]
    gateway_ip = str(ipaddress.ip_network(cni_node.subnet)[1])  # the bridge, in the node netns
    with proxy_in(raced_box):
        assert connect(raced_box.netns_name, gateway_ip, 9) == f"outbound|{gateway_ip}:9"
        assert connect(cni_node.netns_name, ip, 8080) == f"inbound|{ip}:8080"

    with proxy_in(paused_box):  # found through /proc only
        assert connect(paused_box.netns_name, gateway_ip, 9) == f"outbound|{gateway_ip}:9"
    assert not has_istio_rules(plain_box.netns_name), "a pod without sidecar was changed"

    metrics = agent.get("/metrics")[1]
    assert metric_value(metrics, REPAIRED, type="repair", result="success") == 3.0
    logs = agent.logs()
    for name in ("raced", "failing", "paused"):
        assert (
            f"pod {POD_NAMESPACE}/{name} started without traffic redirect: rules programmed" in logs
        ), logs
    assert metric_value(metrics, REPAIRED, type="repair", result="fail") == 0.0
    # Both pods still exist, unlabeled: repair in place neither deletes nor labels.
    for pod in (raced, failing):
        now = kube_core.read_namespaced_pod(pod["metadata"]["name"], POD_NAMESPACE)
        assert now.metadata.deletion_timestamp is None
        assert "cni.istio.io/uninitialized" not in (now.metadata.labels or {})
    # The chart's ClusterRole in this mode: no deleting pods, no writing their status.
    core = agent_core()
    assert try_call(core.delete_namespaced_pod, "raced", POD_NAMESPACE) == 403
    assert (
        try_call(
            core.patch_namespaced_pod_status,
            "raced",
            POD_NAMESPACE,
            {"metadata": {"labels": {"x": "y"}}},
        )
        == 403
    )
    assert agent.stop() == 0


def test_delete_mode_deletes_the_broken_pod(
    chart_on_node: ChartOnNode,
    helm_releases: Any,
    helm_binaries: dict[str, Any],
    cni_node: CniNode,
    node_pods: NodePods,
    kube_core: Any,
    agent_core: Any,
    pod_sandboxes: PodSandboxes,
) -> None:
    helm: Helm = helm_releases(helm_binaries[max(helm_binaries)])
    broken, box = started_before_agent(
        cni_node, node_pods, kube_core, "broken", sandboxes=pod_sandboxes, failed_validation=True
    )
    agent = start_agent(chart_on_node, helm, "delete")

    event = wait_for_event(kube_core, broken, "DeleteBrokenPod")
    assert event.involved_object.uid == broken["metadata"]["uid"]

    def gone() -> bool:
        return try_call(kube_core.read_namespaced_pod, "broken", POD_NAMESPACE) == 404

    wait_for(gone, "the broken pod to be deleted", REPAIR_TIMEOUT)
    assert not has_istio_rules(box.netns_name)  # deleted, not repaired
    metrics = agent.get("/metrics")[1]
    assert metric_value(metrics, REPAIRED, type="delete", result="success") == 1.0
    assert f"pod {POD_NAMESPACE}/broken started without traffic redirect: deleted" in agent.logs()

    # Preconditions: with the chart's delete-mode identity, a pod that changed since repair
    # looked at it (new resourceVersion) or was replaced (new UID) is not deleted.
    core = agent_core()
    changed = node_pods.create(POD_NAMESPACE, "changed")
    kube_core.patch_namespaced_pod("changed", POD_NAMESPACE, {"metadata": {"labels": {"a": "b"}}})
    with pytest.raises(ApiException) as refused:
        actions.delete_pod(core, changed)
    assert refused.value.status == 409
    node_pods.delete(POD_NAMESPACE, "changed")
    replaced = node_pods.create(POD_NAMESPACE, "changed")
    with pytest.raises(ApiException) as refused:
        actions.delete_pod(core, changed)
    assert refused.value.status == 409
    assert (
        kube_core.read_namespaced_pod("changed", POD_NAMESPACE).metadata.uid
        == (replaced["metadata"]["uid"])
    )
    # This mode may delete pods, not write their status.
    assert (
        try_call(
            core.patch_namespaced_pod_status,
            "changed",
            POD_NAMESPACE,
            {"metadata": {"labels": {"x": "y"}}},
        )
        == 403
    )
    assert agent.stop() == 0


def test_label_mode_labels_the_broken_pod(
    chart_on_node: ChartOnNode,
    helm_releases: Any,
    helm_binaries: dict[str, Any],
    cni_node: CniNode,
    node_pods: NodePods,
    kube_core: Any,
    agent_core: Any,
    pod_sandboxes: PodSandboxes,
) -> None:
    helm: Helm = helm_releases(helm_binaries[max(helm_binaries)])
    broken, box = started_before_agent(
        cni_node, node_pods, kube_core, "broken", sandboxes=pod_sandboxes, failed_validation=True
    )
    agent = start_agent(chart_on_node, helm, "label")

    def labeled() -> bool:
        pod = kube_core.read_namespaced_pod("broken", POD_NAMESPACE)
        return (pod.metadata.labels or {}).get("cni.istio.io/uninitialized") == "true"

    wait_for(labeled, "the label cni.istio.io/uninitialized=true", REPAIR_TIMEOUT)
    wait_for_event(kube_core, broken, "LabelBrokenPod")
    pod = kube_core.read_namespaced_pod("broken", POD_NAMESPACE)
    assert pod.metadata.deletion_timestamp is None and pod.metadata.uid == broken["metadata"]["uid"]
    assert not has_istio_rules(box.netns_name)  # labeled only
    metrics = agent.get("/metrics")[1]
    assert metric_value(metrics, REPAIRED, type="label", result="success") == 1.0
    assert "labeled cni.istio.io/uninitialized=true" in agent.logs()
    # This mode may write pod status, not delete pods.
    core = agent_core()
    assert try_call(core.delete_namespaced_pod, "broken", POD_NAMESPACE) == 403
    assert agent.stop() == 0


def test_a_pod_that_cannot_be_repaired_is_reported_once(
    chart_on_node: ChartOnNode,
    helm_releases: Any,
    helm_binaries: dict[str, Any],
    cni_node: CniNode,
    node_pods: NodePods,
    kube_core: Any,
) -> None:
    """A broken pod whose netns is not on this node: retried every round, one Event and one
    failure counted, not one per round."""
    helm: Helm = helm_releases(helm_binaries[max(helm_binaries)])
    lost = node_pods.create(POD_NAMESPACE, "lost", **SIDECAR)
    nowhere = str(ipaddress.ip_network(cni_node.subnet)[200])  # no netns holds it
    node_pods.set_running(POD_NAMESPACE, "lost", nowhere)
    report_validation_failed(kube_core, "lost")
    installed = chart_on_node.install(helm, NAMESPACE, {"logLevel": "debug"})
    agent = chart_on_node.start_agent(installed)
    agent.wait_ready()

    attempt = f"repair of pod {POD_NAMESPACE}/lost (repair-in-place) failed"
    wait_for(lambda: agent.logs().count(attempt) >= 3, "three repair rounds", 3 * REPAIR_TIMEOUT)
    events = [e for e in events_of(kube_core, lost) if e.reason == "RepairBrokenPod"]
    assert len(events) == 1, [e.message for e in events]
    assert "network namespace not found" in events[0].message
    metrics = agent.get("/metrics")[1]
    assert metric_value(metrics, REPAIRED, type="repair", result="fail") == 1.0
    assert agent.stop() == 0
