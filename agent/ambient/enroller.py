"""The ambient side of a CNI ADD/DEL (Istio: the plugin's isAmbientPod, then the agent's
ReconcileCNIAddEvent): is this pod enrolled by ambient, and if so enroll it with the request's
netns.

Namespace lookup: the namespace cache first; with Istio's enableAmbientDetectionRetry a missing
namespace is retried, else tried once. A cache can be behind the API server: a namespace
labelled `ambient` just before the pod was created may not have reached it yet, and the pod
would start uncaptured (Istio's plugin GETs the namespace at every ADD). So when the cached
namespace says "not ambient" for a pod whose namespace's labels decide (some enablement
selector with a namespace selector matches the pod itself), the namespace is read from the API
server and decides; a pod whose namespace cannot change the verdict (excluded, opted out, host
network, sidecar, ...) costs no read.

When a lookup fails the agent cannot tell whether the pod must be captured, so the ADD fails
with "try again" (the runtime retries the sandbox) and the pod never starts uncaptured. Istio
instead treats such a pod as not ambient unless the retry is on; `fail_open`
(ambient.failOpenOnDetectionError) is that choice, made by the user.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from agent.ambient.enrollment import Decision, namespace_may_enroll, should_enroll
from agent.errors import AmbientLookupError, NonRetryableAdd, ZtunnelPending
from agent.label_selectors import EnablementSelector

log = logging.getLogger(__name__)


class NamespaceSource(Protocol):
    def get_namespace(self, name: str, *, retry: bool = True) -> Mapping[str, Any] | None:
        """The Namespace as API JSON; None when it does not exist; raises when lookup failed."""
        ...

    def read_namespace(self, name: str) -> Mapping[str, Any] | None:
        """The Namespace from the API server now (a GET); None when it does not exist."""
        ...


class Mesh(Protocol):
    def add(
        self,
        pod: Mapping[str, Any],
        netns_path: str = "",
        *,
        sandbox: str = "",
        ips: tuple[str, ...] = (),
    ) -> object: ...
    def remove(self, pod: Mapping[str, Any], *, deleted: bool, sandbox: str = "") -> None: ...


@dataclass(frozen=True)
class Verdict:
    enroll: bool
    reason: str


class AmbientEnroller:
    """decide / enroll / release for the pod server (agent.podserver.handlers)."""

    def __init__(
        self,
        *,
        namespaces: NamespaceSource,
        mesh: Mesh,
        selectors: Sequence[EnablementSelector],
        exclude_namespaces: Collection[str],
        system_namespace: str,
        detection_retry: bool,
        fail_open: bool = False,
    ) -> None:
        self._namespaces = namespaces
        self._mesh = mesh
        self._selectors = tuple(selectors)
        self._exclude = tuple(exclude_namespaces)
        self._system_ns = system_namespace
        self._retry = detection_retry
        self._fail_open = fail_open

    def decide(self, pod: Mapping[str, Any]) -> Verdict:
        meta = pod.get("metadata") or {}
        ns_name = str(meta.get("namespace") or "default")
        try:
            namespace = self._namespaces.get_namespace(ns_name, retry=self._retry)
            if namespace is None:
                raise AmbientLookupError(f"namespace {ns_name} not found")
            if not self._should_enroll(pod, namespace).enroll and namespace_may_enroll(
                pod,
                self._selectors,
                exclude_namespaces=self._exclude,
                system_namespace=self._system_ns,
            ):
                namespace = self._namespaces.read_namespace(ns_name)
                if namespace is None:
                    raise AmbientLookupError(f"namespace {ns_name} not found (API server)")
        except Exception as e:
            if not self._fail_open:
                raise AmbientLookupError(
                    f"look up namespace {ns_name} for ambient detection: {e}"
                ) from e
            log.warning(
                "ambient detection failed; treating pod as not ambient "
                "(ambient.failOpenOnDetectionError)",
                extra={"fields": {"pod": f"{ns_name}/{meta.get('name')}", "error": str(e)}},
            )
            return Verdict(False, f"ambient detection failed ({e})")
        decision = self._should_enroll(pod, namespace)
        return Verdict(decision.enroll, decision.reason)

    def _should_enroll(self, pod: Mapping[str, Any], namespace: Mapping[str, Any]) -> Decision:
        return should_enroll(
            pod,
            namespace,
            self._selectors,
            exclude_namespaces=self._exclude,
            system_namespace=self._system_ns,
        )

    def enroll(
        self, pod: Mapping[str, Any], netns: str, *, sandbox: str = "", ips: tuple[str, ...] = ()
    ) -> str:
        """Enroll with the request's netns, sandbox and IPs (the CNI result's); raises (a CNI
        error) when the pod is not captured and handed to ztunnel."""
        self._mesh.add(pod, netns, sandbox=sandbox, ips=ips)
        return "enrolled in ambient (in-pod rules applied, ztunnel took the pod)"

    def release(self, pod: Mapping[str, Any], *, sandbox: str = "") -> None:
        """A CNI DEL: released only when `sandbox` is the one the pod is enrolled with."""
        self._mesh.remove(pod, deleted=True, sandbox=sandbox)


__all__ = ["AmbientEnroller", "AmbientLookupError", "NonRetryableAdd", "Verdict", "ZtunnelPending"]
