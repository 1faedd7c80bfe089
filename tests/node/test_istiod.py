"""The real Istio control plane on the real node: Istio's own `base` and `istiod` charts installed
by Helm, istiod's webhook injecting a Deployment created plainly in a namespace labelled
`istio-injection=enabled`, with `pilot.cni.enabled` so that it injects `istio-validation` instead of
`istio-init`. The pod runs Istio's real pilot-agent (the test bed's proxy image, Envoy's double
beside it): its `istio-validation` (`pilot-agent istio-iptables --run-validation`) must pass against
the rules our agent programmed, its outbound connections reach the proxy with their original
destination, and the pod becomes Ready through pilot-agent's own readiness check (kubelet probes
15021, which the double forwards to pilot-agent's 15020 as Envoy's bootstrap listener does;
pilot-agent asks the double's admin API for Envoy's stats). istiod runs on the host
(testbed/istiod.py says why and what the test bed sets up for it).

Then what else istiod injects: classic sidecars, TPROXY, the traffic annotations it passes
through, DNS capture, each with the rules in the pod's namespace equal to `istio-cni-agent rules
--pod` of the injected pod; and the failure the validation exists for (a pod started with no
agent serving the node exits 126) with the repair controller handling it in each mode.

On containerd 2, the node laid out as kind's (tests/node/conftest.py on_containerd2): kindnet's
ptp conflist, pod netns in /var/run/netns, as on kind, GKE and EKS nodes today."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from testbed import chart as agent_mod
from testbed import kubepods, nodetaint, podnet
from testbed.images import Image
from testbed.injected import (
    APP_PORT,
    OUTSIDE,
    PROXY,
    VALIDATION,
    assert_inbound_captured,
    assert_outbound_captured,
    assert_rules_as_printed,
    assert_validation_passed,
    connect_loop,
    deployment,
    injected_namespace,
    proxy_container,
    sidecar_state,
    wait_deployment_pod,
    wait_injected_running,
)
from testbed.istiod import Istiod
from testbed.realnode import RealCluster

pytestmark = [pytest.mark.node, pytest.mark.istiod, pytest.mark.usefixtures("on_containerd2")]


@pytest.fixture
def injected_ns(real_cluster: RealCluster, node_core: Any, istiod: Istiod) -> Iterator[str]:
    with injected_namespace(node_core, real_cluster.apps(), istiod) as name:
        yield name


def test_istiod_injects_validation_passes_traffic_captured(
    real_cluster: RealCluster,
    node_helm: Any,
    node_core: Any,
    agent_image: Image,
    istiod: Istiod,
    injected_ns: str,
    tmp_path: Path,
) -> None:
    agent = agent_mod.install(node_helm("4"), real_cluster, node_core, agent_image)
    manifest = deployment("web", real_cluster.images["workload"].ref, connect_loop())
    real_cluster.apps().create_namespaced_deployment(injected_ns, manifest)
    pod = wait_deployment_pod(node_core, injected_ns, "app=web", istiod)
    view = wait_injected_running(node_core, injected_ns, pod)
    pod = node_core.read_namespaced_pod(view.name, injected_ns)

    # What istiod's injector made of it, read back from the API server.
    inits = [c.name for c in pod.spec.init_containers or []]
    containers = [c.name for c in pod.spec.containers]
    assert "istio-init" not in inits, inits
    assert VALIDATION in inits, inits
    # Kubernetes 1.35's node: istiod's auto-detection makes istio-proxy a native sidecar.
    assert inits == [VALIDATION, PROXY], inits
    native = pod.spec.init_containers[1]
    assert native.restart_policy == "Always", native
    assert containers == ["app"], containers
    # Kept for comparing with the pods the other tiers write by hand.
    manifest_out = tmp_path / "injected-pod.yaml"
    manifest_out.write_text(yaml.safe_dump(node_core.api_client.sanitize_for_serialization(pod)))
    assert "sidecar.istio.io/status" in (pod.metadata.annotations or {})
    proxy_ref = istiod.proxy.ref
    images_of = {c.name: c.image for c in [*(pod.spec.init_containers or []), *pod.spec.containers]}
    assert images_of[VALIDATION] == images_of[PROXY] == proxy_ref, images_of
    validation = next(c for c in pod.spec.init_containers if c.name == VALIDATION)
    assert validation.args[0] == "istio-iptables" and "--run-validation" in validation.args

    # Istio's own validation of our rules: exited 0, and said why.
    assert_validation_passed(node_core, injected_ns, pod)

    # Outbound: the app's connections to an outside address reach the proxy's 15001.
    assert_outbound_captured(node_core, injected_ns, pod)
    app_log = kubepods.logs(node_core, injected_ns, view.name, "app")
    assert not any(kubepods.escaped(s) for s in app_log.splitlines()), app_log[-2000:]
    # The proxy's side: Envoy's double, started by the real pilot-agent.
    kubepods.wait_log_line(
        node_core,
        injected_ns,
        view.name,
        PROXY,
        lambda s: (
            f"port=15001 peer={view.ip}:" in s and f"original_dst={OUTSIDE[0]}:{OUTSIDE[1]}" in s
        ),
        "the proxy's side of it",
    )

    # Inbound: to the pod's IP from the node, the proxy's 15006.
    assert view.ip
    assert_inbound_captured(real_cluster.network.netns_path, pod)

    assert_rules_as_printed(node_core, pod, real_cluster.pod_netns(view.uid), tmp_path / "web.json")
    logs = agent.logs(node_core)
    ours = [
        s
        for s in logs.splitlines()
        if "source=plugin" in s and f"pod={injected_ns}/{view.name}" in s
    ]
    assert ours, f"no plugin line for {view.name} in the agent log:\n{logs[-4000:]}"


# -- the failure Istio's validation exists for -----------------------------------------------

REPAIR_LABEL = "cni.istio.io/uninitialized"


@pytest.mark.parametrize("mode", ["repair-in-place", "delete", "label"])
def test_validation_fails_without_the_agent_and_repair_handles_the_pod(
    real_cluster: RealCluster,
    node_helm: Any,
    node_core: Any,
    agent_image: Image,
    istiod: Istiod,
    injected_ns: str,
    mode: str,
) -> None:
    """A pod istiod injected for CNI, started while no agent serves the node: its real
    `istio-validation` finds no redirect and exits 126. Then the agent comes, and its repair
    controller handles the pod as Istio's does in that mode: programs the pod's namespace so the
    next validation passes, deletes it so its Deployment makes a captured one, or labels it."""
    manifest = deployment("early", real_cluster.images["workload"].ref, connect_loop())
    real_cluster.apps().create_namespaced_deployment(injected_ns, manifest)
    first = wait_deployment_pod(node_core, injected_ns, "app=early", istiod)
    name = first.metadata.name
    failed = kubepods.wait_for(
        lambda: _validation_exit_codes(node_core, injected_ns, name),
        f"{name}: istio-validation to fail",
        120,
        interval=0.5,
        on_timeout=lambda: sidecar_state(node_core, injected_ns, first),
    )
    assert failed == [126], failed
    log = _ended_runs_log(node_core, injected_ns, name)
    assert "validation failed" in log.lower(), log[-3000:]

    agent_mod.install(node_helm("4"), real_cluster, node_core, agent_image, repair={"mode": mode})
    if mode == "repair-in-place":
        view = wait_injected_running(node_core, injected_ns, first)
        assert "Validation passed" in kubepods.logs(node_core, injected_ns, name, VALIDATION)
        assert podnet.has_istio_rules(real_cluster.pod_netns(view.uid))
        assert_outbound_captured(node_core, injected_ns, first)
    elif mode == "delete":
        kubepods.wait_for(
            lambda: _gone(node_core, injected_ns, name), f"{name} deleted by repair", 90
        )
        again = wait_deployment_pod(node_core, injected_ns, "app=early", istiod)
        view = wait_injected_running(node_core, injected_ns, again)
        fresh = node_core.read_namespaced_pod(view.name, injected_ns)
        assert_validation_passed(node_core, injected_ns, fresh)
        assert _restarts(fresh, VALIDATION) == 0, fresh.status.init_container_statuses
    else:
        labelled = kubepods.wait_for(
            lambda: _labels(node_core, injected_ns, name).get(REPAIR_LABEL) or None,
            f"{name} labelled {REPAIR_LABEL}",
            90,
        )
        assert labelled == "true", labelled
        still = node_core.read_namespaced_pod(name, injected_ns)
        assert not podnet.has_istio_rules(real_cluster.pod_netns(still.metadata.uid))


def _validation_exit_codes(core: Any, namespace: str, name: str) -> list[int]:
    """Exit codes of the pod's istio-validation runs that ended (its state and last state)."""
    pod = core.read_namespaced_pod(name, namespace)
    codes = []
    for status in pod.status.init_container_statuses or []:
        if status.name == VALIDATION:
            for state in (status.last_state, status.state):
                if state is not None and state.terminated is not None:
                    codes.append(state.terminated.exit_code)
    return sorted(set(codes))


def _ended_runs_log(core: Any, namespace: str, name: str) -> str:
    """istio-validation's log of its run before the current one, then the current one's: by the
    time the failed run is seen, kubelet may have started the next, whose log is the current
    one (seen on the Kubernetes 1.37.2 bed: only its first lines)."""
    previous = kubepods.logs(core, namespace, name, VALIDATION, previous=True)
    return previous + kubepods.logs(core, namespace, name, VALIDATION)


def _restarts(pod: Any, container: str) -> int:
    statuses = pod.status.init_container_statuses or []
    return int(next(s.restart_count for s in statuses if s.name == container))


def _labels(core: Any, namespace: str, name: str) -> dict[str, str]:
    return dict(core.read_namespaced_pod(name, namespace).metadata.labels or {})


def _gone(core: Any, namespace: str, name: str) -> bool:
    try:
        pod = core.read_namespaced_pod(name, namespace)
    except ApiException as e:
        if e.status == 404:
            return True
        raise
    return pod.metadata.deletion_timestamp is not None


# -- what the injector passes through ------------------------------------------------------

EXCLUDE_INBOUND = "traffic.sidecar.istio.io/excludeInboundPorts"
TRAFFIC = {
    "traffic.sidecar.istio.io/includeOutboundIPRanges": "203.0.113.0/24,198.51.100.0/24",
    "traffic.sidecar.istio.io/excludeOutboundIPRanges": "203.0.113.200/32",
    "traffic.sidecar.istio.io/excludeOutboundPorts": "9999",
    "traffic.sidecar.istio.io/includeOutboundPorts": "7777",
    "traffic.sidecar.istio.io/includeInboundPorts": f"{APP_PORT},9090",
    EXCLUDE_INBOUND: "9191",
    "traffic.sidecar.istio.io/excludeInterfaces": "eth9",
    "traffic.sidecar.istio.io/kubevirtInterfaces": "vnet0",
}
DNS_CAPTURE = {"ISTIO_META_DNS_CAPTURE": "true"}
VARIANTS: dict[str, dict[str, str]] = {
    "classic": {"sidecar.istio.io/nativeSidecar": "false"},
    "tproxy": {"sidecar.istio.io/interceptionMode": "TPROXY"},
    "traffic": TRAFFIC,
    # A classic sidecar: pilot-agent's readiness waits for istiod's DNS name table, which no pod
    # here can fetch (it cannot reach istiod), and an app behind a native sidecar never starts.
    "dns": {
        "proxy.istio.io/config": json.dumps({"proxyMetadata": DNS_CAPTURE}),
        "sidecar.istio.io/nativeSidecar": "false",
    },
    "reroute": {"istio.io/reroute-virtual-interfaces": "vnet1"},
}
UNREADY = {"dns"}  # Running, but never Ready here (see VARIANTS)


def test_injected_variants_validated_captured_and_programmed_as_rules_pod_prints(
    real_cluster: RealCluster,
    node_helm: Any,
    node_core: Any,
    agent_image: Image,
    istiod: Istiod,
    injected_ns: str,
    tmp_path: Path,
) -> None:
    """Classic sidecars, TPROXY, every traffic annotation the injector passes through (and
    `istio.io/reroute-virtual-interfaces`) and DNS
    capture, all at once (dual-stack off: the node is IPv4 only). For each injected pod: Istio's
    validation passed, outbound and inbound reach the proxy with their original destinations,
    and the rules in its namespace are what `istio-cni-agent rules --pod` prints for the pod read
    back from the API server, restored by the same iptables in an empty namespace."""
    agent_mod.install(node_helm("4"), real_cluster, node_core, agent_image)
    image = real_cluster.images["workload"].ref
    for name, pod_annotations in VARIANTS.items():
        manifest = deployment(name, image, connect_loop(), pod_annotations)
        real_cluster.apps().create_namespaced_deployment(injected_ns, manifest)
    pods = {}
    for name in VARIANTS:
        pod = wait_deployment_pod(node_core, injected_ns, f"app={name}", istiod)
        view = wait_injected_running(
            node_core, injected_ns, pod, timeout=180, ready=name not in UNREADY
        )
        pods[name] = node_core.read_namespaced_pod(view.name, injected_ns)

    for name, pod in pods.items():
        assert_validation_passed(node_core, injected_ns, pod)
        assert_outbound_captured(node_core, injected_ns, pod)
        assert_inbound_captured(real_cluster.network.netns_path, pod)
        netns = real_cluster.pod_netns(pod.metadata.uid)
        assert_rules_as_printed(node_core, pod, netns, tmp_path / f"{name}.json")

    classic = pods["classic"]
    assert [c.name for c in classic.spec.init_containers] == [VALIDATION], classic.spec
    assert [c.name for c in classic.spec.containers] == ["app", PROXY], classic.spec

    tproxy = pods["tproxy"]
    assert tproxy.metadata.annotations["sidecar.istio.io/interceptionMode"] == "TPROXY"
    mangle = _iptables_save(real_cluster.pod_netns(tproxy.metadata.uid), "mangle")
    assert "-j TPROXY --on-port 15006" in mangle, mangle

    traffic = pods["traffic"]
    annotations = traffic.metadata.annotations
    # Passed through as written, but for excludeInboundPorts, where the injector appends the
    # proxy's status port (what Istio's own plugin and ours exclude anyway).
    written = {**TRAFFIC, EXCLUDE_INBOUND: f"{TRAFFIC[EXCLUDE_INBOUND]},15020"}
    for key, value in written.items():
        assert annotations.get(key) == value, (key, annotations.get(key))
    netns = real_cluster.pod_netns(traffic.metadata.uid)
    # From the pod (as the app, not the proxy's uid): only what the annotations include.
    for host, port in (OUTSIDE, ("192.0.2.10", 7777)):  # an included range; an included port
        captured = podnet.connect(netns, host, port)
        assert captured.startswith("proxy-double port=15001"), (host, port, captured)
        assert f"original_dst={host}:{port}" in captured, captured
    for host, port in (("203.0.113.200", 80), (OUTSIDE[0], 9999), ("192.0.2.10", 80)):
        assert podnet.connect(netns, host, port).startswith("error|"), (host, port)
    node_netns = real_cluster.network.netns_path
    for port in (9191, 8081):  # excluded, and not among the included inbound ports
        assert podnet.connect(node_netns, traffic.status.pod_ip, port).startswith("error|"), port

    reroute = pods["reroute"]
    assert reroute.metadata.annotations["istio.io/reroute-virtual-interfaces"] == "vnet1"
    nat = _iptables_save(real_cluster.pod_netns(reroute.metadata.uid), "nat")
    assert "-A PREROUTING -i vnet1 -j ISTIO_REDIRECT" in nat, nat

    dns = pods["dns"]
    env = {e.name: e.value for e in proxy_container(dns).env or []}
    assert env.get("ISTIO_META_DNS_CAPTURE") == "true", env
    nat = _iptables_save(real_cluster.pod_netns(dns.metadata.uid), "nat")
    assert "--dport 53 -j REDIRECT --to-ports 15053" in nat, nat


def _iptables_save(netns: str, table: str) -> str:
    """One IPv4 table of the namespace, through the iptables variant the agent used there."""
    variant = podnet.iptables_in_use(netns)
    return podnet.in_netns(netns, f"iptables-{variant}-save", "-t", table)


# -- istiod's node untaint controller --------------------------------------------------------


def test_istiod_untaints_the_node_once_the_agent_is_ready_and_the_agent_does_not_fight_it(
    real_cluster: RealCluster,
    node_helm: Any,
    node_core: Any,
    agent_image: Image,
    istiod: Istiod,
    injected_ns: str,
) -> None:
    """The node carries `cni.istio.io/not-ready:NoSchedule` (as a node pool registers it). A
    meshed pod waits unscheduled; with only istiod's untaint controller on (the chart's
    `taint.enabled`, PILOT_ENABLE_NODE_UNTAINT_CONTROLLERS) the taint goes once the agent's pod
    is Ready, and the pod starts captured. Then the node is tainted again and the agent comes
    back with `removeNotReadyTaint` too: both remove the one taint, neither errs nor loops."""
    node = real_cluster.node_name
    helm = node_helm("4")
    with nodetaint.tainted(node_core, node, nodetaint.NOT_READY):
        manifest = deployment("waits", real_cluster.images["workload"].ref, connect_loop())
        real_cluster.apps().create_namespaced_deployment(injected_ns, manifest)
        waiting = wait_deployment_pod(node_core, injected_ns, "app=waits", istiod)
        reason = kubepods.wait_for(
            lambda: _unschedulable(node_core, injected_ns, waiting.metadata.name),
            "the meshed pod held back by the taint",
            60,
        )
        assert "untolerated taint" in reason, reason

        agent = agent_mod.install(helm, real_cluster, node_core, agent_image)
        kubepods.wait_for(
            lambda: (
                nodetaint.NOT_READY["key"] not in nodetaint.keys(nodetaint.taints(node_core, node))
            ),
            "istiod to remove the not-ready taint",
            60,
            on_timeout=lambda: istiod.log()[-3000:],
        )
        view = wait_injected_running(node_core, injected_ns, waiting)
        pod = node_core.read_namespaced_pod(view.name, injected_ns)
        assert_validation_passed(node_core, injected_ns, pod)
        assert_outbound_captured(node_core, injected_ns, pod)
        assert "not-ready taint" not in agent.logs(node_core), "the agent's own removal is off"

        helm.uninstall(agent_mod.RELEASE, namespace=agent_mod.AGENT_NAMESPACE)
        agent_mod.wait_agent_gone(node_core)
        nodetaint.add(node_core, node, nodetaint.NOT_READY)
        agent = agent_mod.install(
            helm, real_cluster, node_core, agent_image, removeNotReadyTaint=True
        )
        kubepods.wait_for(
            lambda: (
                nodetaint.NOT_READY["key"] not in nodetaint.keys(nodetaint.taints(node_core, node))
            ),
            "the not-ready taint removed again",
            60,
        )
        time.sleep(5)  # a fight would show as the taint back, or the agent retrying
        assert nodetaint.NOT_READY["key"] not in nodetaint.keys(nodetaint.taints(node_core, node))
        logs = agent.logs(node_core)
        removal = [s for s in logs.splitlines() if "not-ready taint" in s]
        assert any(
            "removed the not-ready taint" in s or "nothing to remove" in s for s in removal
        ), removal
        assert not any("retrying" in s for s in removal), removal
        fresh = node_core.read_namespaced_pod(agent.pod.name, agent_mod.AGENT_NAMESPACE)
        assert fresh.status.container_statuses[0].restart_count == 0


def _unschedulable(core: Any, namespace: str, name: str) -> str | None:
    """The scheduler's message when it could not place the pod (None while it has not said)."""
    pod = core.read_namespaced_pod(name, namespace)
    for condition in pod.status.conditions or []:
        if condition.type == "PodScheduled" and condition.status == "False":
            return f"{condition.reason}: {condition.message}"
    return None
