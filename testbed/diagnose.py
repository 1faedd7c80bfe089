"""What a real cluster looked like when a wait timed out: its DaemonSets' status, its pods with
their nodes and phases, its Nodes, and the ends of the controller manager's and scheduler's logs.
Registered by the node and scale tiers' fixtures with `testbed.wait.diagnostics`, so every wait
there reports it (each section on its own: a failing API server still leaves the logs)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from testbed.process import Daemon

if TYPE_CHECKING:
    from testbed.realnode import RealCluster

MAX_PODS = 80
LOG_LINES = 30
LOGGED_PARTS = ("kube-controller-manager", "kube-scheduler")


def cluster_report(core: Any, apps: Any, daemons: Callable[[], list[Daemon]]) -> str:
    """The cluster's state through `core`/`apps`, and the log tails of the control plane's
    controller manager and scheduler among `daemons()`."""
    sections: list[tuple[str, Callable[[], str]]] = [
        ("DaemonSets", lambda: daemonsets(apps)),
        ("pods", lambda: pods(core)),
        ("nodes", lambda: nodes(core)),
        *((f"{name} log", functools.partial(_named_tail, daemons, name)) for name in LOGGED_PARTS),
    ]
    out = ["--- cluster state at the timeout ---"]
    for title, section in sections:
        try:
            body = section()
        except Exception as e:  # one section failing must not hide the others
            body = f"  (could not read: {e!r})"[:400]
        out.append(f"{title}:\n{body}")
    return "\n".join(out)


def daemonsets(apps: Any) -> str:
    lines = []
    for ds in apps.list_daemon_set_for_all_namespaces(_request_timeout=10).items:
        s = ds.status
        lines.append(
            f"  {ds.metadata.namespace}/{ds.metadata.name}: generation {ds.metadata.generation} "
            f"observed {s.observed_generation}, desired {s.desired_number_scheduled}, "
            f"scheduled {s.current_number_scheduled}, ready {s.number_ready}, "
            f"available {s.number_available}, updated {s.updated_number_scheduled}, "
            f"misscheduled {s.number_misscheduled}"
        )
    return "\n".join(lines) or "  (none)"


def pods(core: Any) -> str:
    items = core.list_pod_for_all_namespaces(_request_timeout=10).items
    lines = []
    for pod in items[:MAX_PODS]:
        conditions = {c.type: c.status for c in pod.status.conditions or []}
        deleting = " deleting" if pod.metadata.deletion_timestamp else ""
        lines.append(
            f"  {pod.metadata.namespace}/{pod.metadata.name} on {pod.spec.node_name or '-'}: "
            f"{pod.status.phase} ready={conditions.get('Ready', '-')}{deleting} "
            f"uid={pod.metadata.uid}"
        )
    if len(items) > MAX_PODS:
        lines.append(f"  ... and {len(items) - MAX_PODS} more")
    return "\n".join(lines) or "  (none)"


def nodes(core: Any) -> str:
    lines = []
    for node in core.list_node(_request_timeout=10).items:
        ready = next((c for c in node.status.conditions or [] if c.type == "Ready"), None)
        taints = ",".join(f"{t.key}:{t.effect}" for t in node.spec.taints or []) or "-"
        lines.append(
            f"  {node.metadata.name}: Ready={ready.status if ready else '-'} "
            f"({ready.reason if ready else 'no condition'}), "
            f"unschedulable={bool(node.spec.unschedulable)}, taints={taints}"
        )
    return "\n".join(lines) or "  (none)"


def _named_tail(daemons: Callable[[], list[Daemon]], name: str) -> str:
    return log_tail(daemons(), name)


def log_tail(daemons: list[Daemon], name: str) -> str:
    found = [d for d in daemons if d.name == name]
    if not found:
        return f"  (no {name} among {[d.name for d in daemons]})"
    return found[-1].tail(LOG_LINES)


def for_cluster(cluster: RealCluster) -> Callable[[], str]:
    """The report for `cluster` (its control plane's, when it shares another node's)."""

    def report() -> str:
        plane = cluster.plane
        return cluster_report(
            cluster.core(), cluster.apps(), lambda: plane.daemons if plane else []
        )

    return report
