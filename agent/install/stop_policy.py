"""On SIGTERM: uninstall (the DaemonSet is going away from this node) or keep (upgrade, reboot).

Keeping is the safe side: a stale entry makes new pods wait for the next agent (the plugin fails
closed), while a missing one lets them start uncaptured. So only a definite answer uninstalls:
the API server saying the DaemonSet that made this pod is gone (404, or another of its name),
being deleted, or no longer selecting this node; the agent's own pod gone (404) counts only
with its DaemonSet gone too. A refusal (401/403) is no such answer: a force-deleted pod's
token, a rotated signing key or RBAC in the middle of an upgrade are refused alike; neither is an
unreachable or failing API server. Both keep, saying why in the log, unless the agent's watch of
its DaemonSet heard the API server tell of its deletion while the agent ran: `helm uninstall`
deletes the ServiceAccount and RBAC with the DaemonSet, before the kubelet sends SIGTERM.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent.errors import ApiForbidden, ApiNotFound, KubeApiError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StopDecision:
    uninstall: bool
    reason: str


@dataclass(frozen=True)
class ClusterState:
    """What the API server said; `error` set when it could not be asked."""

    daemonset: Mapping[str, Any] | None = None
    """None: the DaemonSet does not exist (any more)."""
    node: Mapping[str, Any] | None = None
    error: str = ""
    refused: bool = False
    """The error is the API server refusing the agent's credentials (401/403)."""
    watched_gone: str = ""
    """Why the agent's watch of its DaemonSet saw it deleted while the agent ran (the API
    server's word, heard before the credentials were refused); "" when it did not."""


def decide(mode: str, state: ClusterState | None) -> StopDecision:
    """Pure decision. mode is Settings.uninstallOnStop: always, never or auto."""
    if mode == "always":
        return StopDecision(True, "uninstallOnStop is always")
    if mode == "never":
        return StopDecision(False, "uninstallOnStop is never")
    if state is None:
        return StopDecision(False, "not running in a pod of a DaemonSet: keeping (fail closed)")
    if state.error and state.watched_gone:
        return StopDecision(
            True, f"DaemonSet is gone: {state.watched_gone} (now asking fails: {state.error})"
        )
    if state.refused:
        return StopDecision(
            False,
            f"the API server refused the agent's credentials ({state.error}): whether the "
            "DaemonSet is gone cannot be confirmed, keeping (fail closed); if the release was "
            "uninstalled, run `istio-cni-agent uninstall` on this node",
        )
    if state.error:
        return StopDecision(False, f"API server unreachable ({state.error}): keeping (fail closed)")
    ds = state.daemonset
    if ds is None:
        return StopDecision(True, "DaemonSet is gone")
    if (ds.get("metadata") or {}).get("deletionTimestamp"):
        return StopDecision(True, "DaemonSet is being deleted")
    if state.node is not None and not node_matches(ds, state.node):
        return StopDecision(True, "this node no longer matches the DaemonSet's node selection")
    return StopDecision(False, "DaemonSet still runs on this node: upgrade or restart, keeping")


def node_matches(daemonset: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """nodeSelector and required node affinity of the DaemonSet's pod template against the node."""
    spec = ((daemonset.get("spec") or {}).get("template") or {}).get("spec") or {}
    labels: Mapping[str, str] = (node.get("metadata") or {}).get("labels") or {}
    selector: Mapping[str, str] = spec.get("nodeSelector") or {}
    if any(labels.get(k) != v for k, v in selector.items()):
        return False
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if not required:
        return True
    name = str((node.get("metadata") or {}).get("name", ""))
    terms: Sequence[Mapping[str, Any]] = required.get("nodeSelectorTerms") or []
    return any(_term_matches(t, labels, name) for t in terms)


def _term_matches(term: Mapping[str, Any], labels: Mapping[str, str], name: str) -> bool:
    exprs = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not exprs and not fields:
        return False  # an empty term matches no node
    return all(_expr_matches(e, labels) for e in exprs) and all(
        _expr_matches(f, {"metadata.name": name}) for f in fields
    )


def _expr_matches(expr: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key, op = expr.get("key", ""), expr.get("operator", "")
    values = [str(v) for v in expr.get("values") or []]
    present = key in labels
    value = labels.get(key, "")
    if op == "In":
        return present and value in values
    if op == "NotIn":
        return not present or value not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt") and present and len(values) == 1:
        try:
            left, right = int(value), int(values[0])
        except ValueError:
            return False
        return left > right if op == "Gt" else left < right
    return False


def fetch_state(
    clients: Any,
    *,
    pod_name: str,
    pod_namespace: str,
    node_name: str,
    timeouts: Any = None,
) -> ClusterState | None:
    """Own pod -> owning DaemonSet (None if gone) and this node, as plain JSON objects.

    `clients` is agent.kube.KubeClients; `timeouts` agent.kube.api.Timeouts (default: the
    settings' defaults). Returns None when the pod has no DaemonSet owner. The agent's own pod
    gone (404: force-deleted) leaves its DaemonSet to be asked by the name it was made from.
    """
    from agent.kube import api  # the Kubernetes client only when the cluster is asked

    timeout = (timeouts or api.DEFAULT_TIMEOUTS).stop()
    try:
        owner = _owner(clients, pod_name, pod_namespace, timeout)
        if owner is None:
            return None
        try:
            ds: Mapping[str, Any] | None = api.get_json(
                clients.apps.read_namespaced_daemon_set,
                owner["name"],
                pod_namespace,
                timeout=timeout,
            )
        except ApiNotFound:
            ds = None
        if (
            ds is not None
            and owner.get("uid")
            and (ds.get("metadata") or {}).get("uid") != owner.get("uid")
        ):
            ds = None  # a new DaemonSet of the same name is not the one that made us
        node = None
        if node_name and ds is not None:
            node = api.get_json(clients.core.read_node, node_name, timeout=timeout)
        return ClusterState(daemonset=ds, node=node)
    except KubeApiError as e:
        if e.answered:
            return ClusterState(error=f"HTTP {e.status} {e.reason}", refused=_refused(e))
        cause = e.cause
        return ClusterState(error=f"{type(cause).__name__}: {str(cause)[:200]}")
    except Exception as e:  # any other failure to ask means "keep" (fail closed)
        return ClusterState(error=f"{type(e).__name__}: {str(e)[:200]}")


def _owner(clients: Any, pod_name: str, namespace: str, timeout: Any) -> Mapping[str, Any] | None:
    """The owner reference of the agent's pod naming a DaemonSet; None when it has none. When
    the pod is gone (404), its DaemonSet by the name a DaemonSet gives its pods (`<name>-xxxxx`),
    with no uid to compare."""
    from agent.kube import api

    try:
        pod = api.get_json(clients.core.read_namespaced_pod, pod_name, namespace, timeout=timeout)
    except ApiNotFound:
        return {"name": pod_name.rsplit("-", 1)[0], "uid": ""}
    references = (pod.get("metadata") or {}).get("ownerReferences") or []
    return next((o for o in references if o.get("kind") == "DaemonSet"), None)


def _refused(error: KubeApiError) -> bool:
    """401/403: the API server would not answer the agent. Not a sign of an uninstall: a
    force-deleted pod's token, a rotated signing key, RBAC in the middle of an upgrade or a
    webhook authorizer that failed answer the same."""
    return isinstance(error, ApiForbidden)


def decide_from_cluster(
    mode: str,
    *,
    pod_name: str,
    pod_namespace: str,
    node_name: str,
    clients: Any = None,
    timeouts: Any = None,
    watched_gone: Callable[[], str] | None = None,
) -> StopDecision:
    """The fetch part: ask the API server only when the mode leaves the choice to it.

    `clients` (agent.kube.KubeClients) are the agent's own, left open; without them a set is
    built for this one question and closed again. `watched_gone`: what the agent's watch of
    its DaemonSet saw (agent.pods.own_daemonset), used when asking now fails.
    """
    if mode in ("always", "never"):
        return decide(mode, None)
    if not pod_name or not pod_namespace:
        return decide(mode, None)
    own = clients is None
    if own:
        try:
            from agent.kube import build_clients

            clients = build_clients()
        except Exception as e:  # no client config: keep
            return decide(mode, ClusterState(error=str(e)[:200]))
    try:
        state = fetch_state(
            clients,
            pod_name=pod_name,
            pod_namespace=pod_namespace,
            node_name=node_name,
            timeouts=timeouts,
        )
    finally:
        if own:
            clients.close()
    if state is not None and state.error and watched_gone is not None:
        state = dataclasses.replace(state, watched_gone=watched_gone())
    return decide(mode, state)
