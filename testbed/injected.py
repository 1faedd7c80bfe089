"""Pods that istiod's webhook injects on the real node, and what the `istiod` tier checks of them
(tests/node/test_istiod.py, tests/node/test_istiod_umbrella.py).

    injected_namespace()    a namespace labelled `istio-injection=enabled`, once istiod wrote its
                            root certificate there; its Deployments go first at the end
    deployment()            a Deployment as a user writes it: nothing of Istio in it
    wait_deployment_pod()   the pod its ReplicaSet made through the webhook
    wait_injected_running() that pod Running (and Ready), or its sidecars' states and logs
    assert_validation_passed(), assert_outbound_captured(), assert_rules_as_printed()

The app connects to OUTSIDE in a loop: an address no namespace here routes, so a line from the
proxy double in its log can only come from the pod's redirect.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kubernetes.client.exceptions import ApiException

from testbed import kubepods, podnet
from testbed.istiod import ROOT_CERT_CONFIGMAP, Istiod
from testbed.wait import WaitTimeout

OUTSIDE = ("203.0.113.10", 80)  # TEST-NET-3: never routed; the node netns has no route out
APP_PORT = 8080
VALIDATION = "istio-validation"
PROXY = "istio-proxy"


@contextlib.contextmanager
def injected_namespace(core: Any, apps: Any, istiod: Istiod) -> Iterator[str]:
    """A namespace labelled for injection, with the root certificate istiod writes into every
    namespace (the injected pods mount it). At the end its Deployments and ReplicaSets go first
    (else they would make the pods again), then its pods, then the namespace."""
    with kubepods.pod_namespace(core, "meshed") as name:
        try:
            core.patch_namespace(name, {"metadata": {"labels": {"istio-injection": "enabled"}}})
            kubepods.wait_for(
                lambda: _has_configmap(core, name, ROOT_CERT_CONFIGMAP),
                f"istiod's {ROOT_CERT_CONFIGMAP} in {name}",
                60,
                on_timeout=lambda: istiod.log()[-3000:],
            )
            yield name
        finally:
            apps.delete_collection_namespaced_deployment(name, propagation_policy="Background")
            apps.delete_collection_namespaced_replica_set(name, propagation_policy="Background")


def connect_loop() -> list[str]:
    return ["connect-loop", OUTSIDE[0], str(OUTSIDE[1]), "0.5"]


def deployment(
    name: str, image: str, command: list[str], annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    """A Deployment as a user writes it: nothing of Istio in it but the pod `annotations`."""
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels, "annotations": dict(annotations or {})},
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


def wait_deployment_pod(core: Any, namespace: str, selector: str, istiod: Istiod) -> Any:
    """The Deployment's pod once the ReplicaSet made it (through istiod's webhook)."""

    def state() -> str:
        events = core.list_namespaced_event(namespace)
        lines = [f"  {e.involved_object.name}: {e.reason}: {e.message}" for e in events.items[-15:]]
        return "events:\n" + "\n".join(lines) + "\nistiod log:\n" + istiod.log()[-3000:]

    pods = kubepods.wait_for(
        lambda: [
            p
            for p in core.list_namespaced_pod(namespace, label_selector=selector).items
            if p.metadata.deletion_timestamp is None
        ],
        f"a pod {selector} in {namespace}",
        60,
        interval=0.5,
        on_timeout=state,
    )
    return pods[0]


def wait_injected_running(
    core: Any, namespace: str, pod: Any, *, timeout: float = 120.0, ready: bool = True
) -> kubepods.PodView:
    """The injected pod Running (and Ready with `ready`); on timeout the failure also carries
    its injected containers' states and logs."""
    try:
        return kubepods.wait_running(
            core, namespace, pod.metadata.name, timeout=timeout, ready=ready
        )
    except WaitTimeout as e:
        raise WaitTimeout(f"{e}\n{sidecar_state(core, namespace, pod)}") from None


def sidecar_state(core: Any, namespace: str, pod: Any) -> str:
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


def proxy_container(pod: Any) -> Any:
    """istio-proxy: a native sidecar (an init container) or a classic one."""
    every = [*(pod.spec.init_containers or []), *pod.spec.containers]
    return next(c for c in every if c.name == PROXY)


def assert_validation_passed(core: Any, namespace: str, pod: Any) -> None:
    """Istio's own check of the rules (`pilot-agent istio-iptables --run-validation`) exited 0
    and said so."""
    name = pod.metadata.name
    status = next(s for s in pod.status.init_container_statuses if s.name == VALIDATION)
    assert status.state.terminated is not None, (name, status.state)
    assert status.state.terminated.exit_code == 0, (name, status.state.terminated)
    validation_log = kubepods.logs(core, namespace, name, VALIDATION)
    assert "Validation passed" in validation_log, (name, validation_log[-3000:])


def assert_outbound_captured(core: Any, namespace: str, pod: Any) -> None:
    """The app's connections to OUTSIDE reached the proxy double's 15001, destination kept."""
    line = kubepods.wait_log_line(
        core,
        namespace,
        pod.metadata.name,
        "app",
        lambda s: "proxy-double port=15001" in s,
        f"{pod.metadata.name}: a connection answered by the proxy",
    )
    assert f"original_dst={OUTSIDE[0]}:{OUTSIDE[1]}" in line, (pod.metadata.name, line)


def assert_inbound_captured(node_netns: str, pod: Any) -> None:
    """From the node to the pod's APP_PORT: the proxy double's 15006, destination kept."""
    ip = pod.status.pod_ip
    answer = podnet.connect(node_netns, ip, APP_PORT)
    assert answer.startswith("proxy-double port=15006"), (pod.metadata.name, answer)
    assert f"original_dst={ip}:{APP_PORT}" in answer, (pod.metadata.name, answer)


def assert_rules_as_printed(core: Any, pod: Any, netns: str, manifest_path: Path) -> None:
    """The pod's iptables rules (both families, through the variant the agent used) equal those
    of `istio-cni-agent rules --pod` for the manifest the API server holds, restored by the same
    iptables in an empty namespace (so both sides are in the tools' own spelling)."""
    manifest_path.write_text(json.dumps(core.api_client.sanitize_for_serialization(pod)))
    printed = subprocess.run(
        [agent_command(), "rules", "--pod", str(manifest_path)],
        capture_output=True, text=True, timeout=60, check=False,
        env={k: v for k, v in os.environ.items() if not k.startswith("ISTIO_")},
    )  # fmt: skip
    assert printed.returncode == 0 and printed.stdout, (pod.metadata.name, printed.stderr)
    variant = podnet.iptables_in_use(netns)
    want = podnet.restored_tables(printed.stdout, variant)
    have = podnet.programmed_tables(netns, variant)
    assert have == want, (
        f"{pod.metadata.name}: the rules in its namespace differ from `rules --pod`:\n"
        + "\n".join(difflib.unified_diff(want, have, "rules --pod", "namespace", lineterm=""))
    )


def agent_command() -> str:
    """`istio-cni-agent` of this test run's environment (the venv beside the interpreter)."""
    return str(Path(sys.executable).with_name("istio-cni-agent"))


def _has_configmap(core: Any, namespace: str, name: str) -> bool:
    try:
        core.read_namespaced_config_map(name, namespace)
        return True
    except ApiException as e:
        if e.status == 404:
            return False
        raise
