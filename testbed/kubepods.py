"""Pods on a real node, through the API only: manifests for the workload image, waits on their
state, their logs (the API's pod log endpoint, as `kubectl logs`), and where a running pod's
network namespace is (for looking at its rules from the test).

Sidecar pods look as Istio's injector leaves them: annotation `sidecar.istio.io/status` and an
`istio-proxy` container, by default the Envoy test double (`/testbed/proxy-double.py`, as UID 1337
like Envoy, so its own connections are not captured), which answers on the capture ports and
forwards nothing. With `proxy_image` (the test bed's `envoy` image) it is a real Envoy that
carries the traffic, Ready once Envoy is (15021), its access log lines on its stdout.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes.client.exceptions import ApiException

from testbed import envoy
from testbed.wait import wait_for as wait_for  # kubepods.wait_for: callers use it by this name

PROXY_UID = 1337
APP = ["/usr/bin/python3", "/testbed/app.py"]
PROXY = ["/usr/bin/python3", "/testbed/proxy-double.py"]
SIDECAR_STATUS = '{"containers":["istio-proxy"],"initContainers":null}'
INTERCEPTION_MODE = "sidecar.istio.io/interceptionMode"
READINESS_PORT = 15021  # Istio's, never captured inbound: kubelet's probe reaches it


def container(
    name: str, image: str, command: list[str] | None, *, uid: int | None = None
) -> dict[str, Any]:
    """`command` None: the image's own entrypoint."""
    spec: dict[str, Any] = {"name": name, "image": image, "imagePullPolicy": "Never"}
    if command is not None:
        spec["command"] = command
    if uid is not None:
        spec["securityContext"] = {"runAsUser": uid, "runAsGroup": uid}
    return spec


VALIDATION = "istio-validation"
VALIDATION_ARGS = [
    "istio-iptables", "-p", "15001", "-z", "15006", "-u", "1337", "-m", "REDIRECT",
    "-i", "*", "-x", "", "-b", "*", "-d", "15090,15021,15020",
    "--log_output_level=default:info", "--run-validation", "--skip-rule-apply",
]  # fmt: skip
"""Istio's injected check that the pod's traffic is redirected, as its injector writes it when
the CNI node agent programs pods: exits 126 (the pod does not start) when it is not."""


def validation_container(proxy_image: str) -> dict[str, Any]:
    """istio-validation as Istio's injector writes it with the CNI on (the test bed's proxy
    image holds Istio's pilot-agent): a pod whose sandbox got no redirect fails there, before
    its app, until the agent's repair programs it."""
    return {
        "name": VALIDATION,
        "image": proxy_image,
        "imagePullPolicy": "Never",
        "args": VALIDATION_ARGS,
        "securityContext": {
            "runAsUser": 1337,
            "runAsGroup": 1337,
            "runAsNonRoot": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        },
    }


def pod_manifest(
    name: str,
    image: str,
    *,
    app_command: list[str],
    sidecar: bool,
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    init_containers: list[dict[str, Any]] | None = None,
    proxy_image: str | None = None,
) -> dict[str, Any]:
    """A pod for the scheduler to place (no nodeName): an `app` container running app.py, and
    with `sidecar` the injector's marks and an `istio-proxy` container: the double, or with
    `proxy_image` that image's Envoy (in TPROXY mode when the annotations say so)."""
    containers = [container("app", image, [*APP, *app_command])]
    notes = dict(annotations or {})
    tproxy = notes.get(INTERCEPTION_MODE) == "TPROXY"
    if sidecar:
        containers.append(
            envoy_container(proxy_image, tproxy=tproxy)
            if proxy_image
            else container("istio-proxy", image, PROXY, uid=PROXY_UID)
        )
        notes.setdefault("sidecar.istio.io/status", SIDECAR_STATUS)
    spec: dict[str, Any] = {
        "containers": containers,
        "terminationGracePeriodSeconds": 1,
        "automountServiceAccountToken": False,
    }
    if init_containers:
        spec["initContainers"] = init_containers
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": notes, "labels": dict(labels or {})},
        "spec": spec,
    }


def envoy_container(image: str, *, tproxy: bool = False) -> dict[str, Any]:
    """istio-proxy as a real Envoy (the image's entrypoint), Ready when Envoy says so. `tproxy`:
    the pod's interception mode is TPROXY: its bootstrap, run as Istio's injector runs the
    proxy then (UID 0, GID 1337, NET_ADMIN only: transparent sockets and original_src's mark;
    the rules let GID 1337's traffic out)."""
    if tproxy:
        command = ["/usr/local/bin/envoy", "--config-path", envoy.IMAGE_TPROXY_BOOTSTRAP]
        spec = container("istio-proxy", image, [*command, *envoy.IMAGE_FLAGS])
        spec["securityContext"] = {
            "runAsUser": 0,
            "runAsGroup": PROXY_UID,
            "runAsNonRoot": False,
            "capabilities": {"drop": ["ALL"], "add": ["NET_ADMIN"]},
        }
    else:
        spec = container("istio-proxy", image, None, uid=PROXY_UID)
    spec["readinessProbe"] = {
        "httpGet": {"path": "/healthz/ready", "port": READINESS_PORT},
        "periodSeconds": 1,
    }
    return spec


def escaped(line: str) -> bool:
    """An app.py `connect` line of a connection that left the pod: refused at once means it
    was redirected to the (not yet listening) proxy port inside the pod; unreachable or timed
    out means it went out of the pod, toward the node netns that has no route."""
    return "connect " in line and " error: " in line and "Connection refused" not in line


@dataclass(frozen=True)
class PodView:
    """The parts of a pod's state the tests look at."""

    name: str
    namespace: str
    uid: str
    phase: str
    node: str | None
    ip: str | None
    ready: bool
    containers: dict[str, dict[str, Any]]
    """name -> state ({"running": ...}, {"waiting": {"reason": ...}}, ...) and restartCount."""
    events_hint: str = ""

    @classmethod
    def of(cls, pod: Any) -> PodView:
        status = pod.status
        conds = {c.type: c.status for c in status.conditions or []}
        containers = {}
        for c in status.container_statuses or []:
            state = c.state.to_dict() if c.state else {}
            containers[c.name] = {
                "state": {k: v for k, v in state.items() if v},
                "restarts": c.restart_count,
                "ready": c.ready,
            }
        return cls(
            pod.metadata.name,
            pod.metadata.namespace,
            pod.metadata.uid,
            status.phase,
            pod.spec.node_name,
            status.pod_ip,
            conds.get("Ready") == "True",
            containers,
        )


def pod_view(core: Any, namespace: str, name: str) -> PodView | None:
    try:
        return PodView.of(core.read_namespaced_pod(name, namespace))
    except ApiException as e:
        if e.status == 404:
            return None
        raise


def pod_events(core: Any, namespace: str, name: str) -> str:
    events = core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}")
    return "\n".join(f"  {e.type} {e.reason}: {e.message}" for e in events.items[-15:])


def wait_running(
    core: Any, namespace: str, name: str, timeout: float = 120.0, ready: bool = True
) -> PodView:
    """Until the pod is Running (and Ready with `ready`); fails with its state and events."""

    def check() -> PodView | None:
        view = pod_view(core, namespace, name)
        if view and view.phase == "Running" and (view.ready or not ready):
            return view
        return None

    result: PodView = wait_for(
        check,
        f"pod {namespace}/{name} Running{' and Ready' if ready else ''}",
        timeout,
        on_timeout=lambda: (
            f"state: {pod_view(core, namespace, name)}\nevents:\n"
            f"{pod_events(core, namespace, name)}"
        ),
    )
    return result


def logs(core: Any, namespace: str, name: str, container: str, *, previous: bool = False) -> str:
    """The container's log through the API server (which asks the kubelet); `previous`: its run
    before the current one."""
    extra = {"previous": True} if previous else {}
    try:
        return str(core.read_namespaced_pod_log(name, namespace, container=container, **extra))
    except ApiException as e:
        if e.status in (400, 404):  # not started yet (no earlier run) / gone
            return ""
        raise


def wait_log_line(
    core: Any,
    namespace: str,
    name: str,
    container: str,
    match: Callable[[str], bool],
    what: str,
    timeout: float = 60.0,
) -> str:
    def check() -> str | None:
        return next(
            (line for line in logs(core, namespace, name, container).splitlines() if match(line)),
            None,
        )

    line: str = wait_for(
        check,
        f"{what} in the log of {namespace}/{name}/{container}",
        timeout,
        interval=0.5,
        on_timeout=lambda: logs(core, namespace, name, container)[-2000:],
    )
    return line


def delete_and_wait(core: Any, namespace: str, name: str, timeout: float = 60.0) -> None:
    try:
        core.delete_namespaced_pod(name, namespace, grace_period_seconds=1)
    except ApiException as e:
        if e.status != 404:
            raise
    wait_for(
        lambda: pod_view(core, namespace, name) is None, f"pod {namespace}/{name} deleted", timeout
    )


@contextlib.contextmanager
def temporary_namespace(core: Any, name: str) -> Iterator[str]:
    """Create namespace `name`; delete it on the way out (gone already is fine)."""
    core.create_namespace({"metadata": {"name": name}})
    try:
        yield name
    finally:
        try:
            core.delete_namespace(name)
        except ApiException as e:
            if e.status != 404:
                raise


@contextlib.contextmanager
def pod_namespace(core: Any, prefix: str) -> Iterator[str]:
    """A fresh namespace `<prefix>-<hex>` ready for pods (its default ServiceAccount, made by the
    serviceaccount controller, exists); on the way out its pods are deleted and waited away."""
    with temporary_namespace(core, f"{prefix}-{secrets.token_hex(3)}") as name:
        try:
            wait_for(lambda: has_default_service_account(core, name), f"{name}/default SA", 30)
            yield name
        finally:
            core.delete_collection_namespaced_pod(name, grace_period_seconds=1)
            wait_for(
                lambda: not core.list_namespaced_pod(name).items,
                f"the pods of {name} to be gone",
                90,
                on_timeout=lambda: "\n".join(
                    f"{p.metadata.name} on {p.spec.node_name}: {p.status.phase}, deleted at "
                    f"{p.metadata.deletion_timestamp}"
                    for p in core.list_namespaced_pod(name).items
                ),
            )


def has_default_service_account(core: Any, namespace: str) -> bool:
    try:
        core.read_namespaced_service_account("default", namespace)
        return True
    except ApiException as e:
        if e.status == 404:
            return False
        raise
