"""The real Istio control plane on the real node: Istio's own `base` and `istiod` charts installed
by Helm, istiod's webhook injecting a Deployment created plainly in a namespace labelled
`istio-injection=enabled`, with `pilot.cni.enabled` so that it injects `istio-validation` instead of
`istio-init`. The pod runs Istio's real pilot-agent (the test bed's proxy image, Envoy's double
beside it): its `istio-validation` (`pilot-agent istio-iptables --run-validation`) must pass against
the rules our agent programmed, its outbound connections reach the proxy with their original
destination, and the pod becomes Ready through pilot-agent's own readiness check (kubelet probes
15021, which the double forwards to pilot-agent's 15020 as Envoy's bootstrap listener does;
pilot-agent asks the double's admin API for Envoy's stats). istiod runs on the host
(testbed/istiod.py says why and what the test bed sets up for it)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from testbed import chart as agent_mod
from testbed import kubepods, podnet
from testbed.images import Image
from testbed.istiod import ROOT_CERT_CONFIGMAP, Istiod
from testbed.realnode import RealCluster
from testbed.wait import WaitTimeout

pytestmark = [pytest.mark.node, pytest.mark.istiod]

OUTSIDE = ("203.0.113.10", 80)  # TEST-NET-3: never routed; the node netns has no route out
APP_PORT = 8080
VALIDATION = "istio-validation"
PROXY = "istio-proxy"


@pytest.fixture
def injected_ns(real_cluster: RealCluster, node_core: Any, istiod: Istiod) -> Iterator[str]:
    """A namespace labelled for injection, with the root certificate istiod writes into every
    namespace (the injected pods mount it). At the end its Deployments and ReplicaSets go first
    (else they would make the pods again), then its pods, then the namespace."""
    apps = real_cluster.apps()
    with kubepods.pod_namespace(node_core, "meshed") as name:
        try:
            labels = {"istio-injection": "enabled"}
            node_core.patch_namespace(name, {"metadata": {"labels": labels}})
            kubepods.wait_for(
                lambda: _has_configmap(node_core, name, ROOT_CERT_CONFIGMAP),
                f"istiod's {ROOT_CERT_CONFIGMAP} in {name}",
                60,
                on_timeout=lambda: istiod.log()[-3000:],
            )
            yield name
        finally:
            apps.delete_collection_namespaced_deployment(name, propagation_policy="Background")
            apps.delete_collection_namespaced_replica_set(name, propagation_policy="Background")


def deployment(name: str, image: str, command: list[str]) -> dict[str, Any]:
    """A Deployment as a user writes it: nothing of Istio in it."""
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "terminationGracePeriodSeconds": 2,
                    "containers": [
                        {
                            "name": "app",
                            "image": image,
                            "imagePullPolicy": "Never",
                            "command": [*kubepods.APP, *command],
                            "ports": [{"containerPort": APP_PORT}],
                        }
                    ],
                },
            },
        },
    }


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
    loop = ["connect-loop", OUTSIDE[0], str(OUTSIDE[1]), "0.5"]
    manifest = deployment("web", real_cluster.images["workload"].ref, loop)
    real_cluster.apps().create_namespaced_deployment(injected_ns, manifest)
    pod = _wait_deployment_pod(node_core, injected_ns, "app=web", istiod)
    try:
        view = kubepods.wait_running(node_core, injected_ns, pod.metadata.name, timeout=120)
    except WaitTimeout as e:
        raise WaitTimeout(f"{e}\n{_sidecar_state(node_core, injected_ns, pod)}") from None
    pod = node_core.read_namespaced_pod(view.name, injected_ns)

    # What istiod's injector made of it, read back from the API server.
    inits = [c.name for c in pod.spec.init_containers or []]
    containers = [c.name for c in pod.spec.containers]
    assert "istio-init" not in inits, inits
    assert VALIDATION in inits, inits
    # Kubernetes 1.35's node: istiod's auto-detection makes istio-proxy a native sidecar.
    assert inits == [VALIDATION, PROXY], inits
    proxy_container = pod.spec.init_containers[1]
    assert proxy_container.restart_policy == "Always", proxy_container
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
    status = next(s for s in pod.status.init_container_statuses if s.name == VALIDATION)
    assert status.state.terminated is not None, status.state
    assert status.state.terminated.exit_code == 0, status.state.terminated
    validation_log = kubepods.logs(node_core, injected_ns, view.name, VALIDATION)
    assert "Validation passed" in validation_log, validation_log[-3000:]

    # Outbound: the app's connections to an outside address reach the proxy's 15001.
    line = kubepods.wait_log_line(
        node_core,
        injected_ns,
        view.name,
        "app",
        lambda s: "proxy-double port=15001" in s,
        "a connection answered by the proxy",
    )
    assert f"original_dst={OUTSIDE[0]}:{OUTSIDE[1]}" in line, line
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
    node_side = podnet.connect(real_cluster.network.netns_path, view.ip, APP_PORT)
    assert node_side.startswith("proxy-double port=15006"), node_side
    assert f"original_dst={view.ip}:{APP_PORT}" in node_side, node_side

    assert podnet.has_istio_rules(real_cluster.pod_netns(view.uid))
    logs = agent.logs(node_core)
    ours = [
        s
        for s in logs.splitlines()
        if "source=plugin" in s and f"pod={injected_ns}/{view.name}" in s
    ]
    assert ours, f"no plugin line for {view.name} in the agent log:\n{logs[-4000:]}"


def _wait_deployment_pod(core: Any, namespace: str, selector: str, istiod: Istiod) -> Any:
    """The Deployment's pod once the ReplicaSet made it (through istiod's webhook)."""

    def state() -> str:
        events = core.list_namespaced_event(namespace)
        lines = [f"  {e.involved_object.name}: {e.reason}: {e.message}" for e in events.items[-15:]]
        return "events:\n" + "\n".join(lines) + "\nistiod log:\n" + istiod.log()[-3000:]

    pods = kubepods.wait_for(
        lambda: core.list_namespaced_pod(namespace, label_selector=selector).items,
        f"a pod {selector} in {namespace}",
        60,
        interval=0.5,
        on_timeout=state,
    )
    return pods[0]


def _sidecar_state(core: Any, namespace: str, pod: Any) -> str:
    """The injected containers' states and logs, for a pod that did not come up."""
    fresh = core.read_namespaced_pod(pod.metadata.name, namespace)
    lines = [
        f"init container {s.name}: {s.state.to_dict()} restarts={s.restart_count}"
        for s in fresh.status.init_container_statuses or []
    ]
    for name in (VALIDATION, PROXY):
        log = kubepods.logs(core, namespace, pod.metadata.name, name)
        cut = log if len(log) < 8000 else f"{log[:4000]}\n[...]\n{log[-4000:]}"
        lines += [f"--- log of {name}:", cut]
    return "\n".join(lines)


def _has_configmap(core: Any, namespace: str, name: str) -> bool:
    try:
        core.read_namespaced_config_map(name, namespace)
        return True
    except ApiException as e:
        if e.status == 404:
            return False
        raise
