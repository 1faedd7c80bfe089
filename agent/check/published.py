"""What the agents publish about pods and about their node's CNI config, read without a node
credential: the Warning Events they create (docs/check.md lists them).

    RedirectRefused       a sidecar pod's CNI ADD refused (the pod does not start; the runtime
                          retries): component istio-cni, host = node
    RepairBrokenPod,      repair found a pod running without redirect and fixed, deleted or
    DeleteBrokenPod,      labelled it; the message says `... failed: why` when it could not
    LabelBrokenPod        (component istio-cni-repair, host = node)
    RedirectRulesDiffer   a captured pod's rules differ from this release's rendering (left as
                          they are)
    CNIConfigConflict     on the agent's own pod: another writer keeps removing its entry
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent.check.facts import Facts, seg
from agent.check.result import Result, failure, passed, warning

REFUSED = "RedirectRefused"
RULES_DIFFER = "RedirectRulesDiffer"
REPAIRS = ("RepairBrokenPod", "DeleteBrokenPod", "LabelBrokenPod")
CONFLICT = "CNIConfigConflict"
"""The agent's Event reasons (tests/check asserts they are the agent's own constants)."""


def _node(event: Mapping[str, Any]) -> str:
    return str((event.get("source") or {}).get("host") or event.get("reportingInstance") or "?")


def _when(event: Mapping[str, Any]) -> str:
    return str(event.get("lastTimestamp") or event.get("eventTime") or "")


def _latest(events: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, Any]]:
    """The last Event per (node, namespace/pod, reason)."""
    out: dict[tuple[str, str, str], dict[str, Any]] = {}
    for event in sorted(events, key=_when):
        obj = event.get("involvedObject") or {}
        out[(_node(event), f"{obj.get('namespace')}/{obj.get('name')}", event["reason"])] = event
    return out


def agent_events(facts: Facts, ds: Mapping[str, Any], reason: str) -> list[tuple[str, str]]:
    """(node, message) of `reason` Events on this DaemonSet's pods, the last one per node."""
    names = {p["metadata"]["name"] for p in facts.pods_of(ds)}
    events = facts.events(
        f"involvedObject.kind=Pod,reason={reason}", str(ds["metadata"]["namespace"])
    )
    mine = [e for e in events if (e.get("involvedObject") or {}).get("name") in names]
    last = {node: str(e.get("message") or "") for (node, _, _), e in _latest(mine).items()}
    return sorted(last.items())


def pods(facts: Facts) -> Result:
    """Per node: pods refused, not repaired, or with differing rules."""
    name = "pods"
    events = [e for r in (REFUSED, RULES_DIFFER, *REPAIRS) for e in facts.events(f"reason={r}")]
    failed, differ, repaired = [], [], []
    for (node, pod, reason), event in sorted(_latest(events).items()):
        message, count = str(event.get("message") or ""), event.get("count") or 1
        if reason == RULES_DIFFER:
            differ.append(f"{node}: {pod}: rules differ from this release's (restart the pod)")
        elif reason == REFUSED:
            state = _pod_state(facts, event)
            line = f"{node}: {pod}: refused {count} times, now {state}: {message}"
            if state in ("Running", "Succeeded"):
                differ.append(line)  # it started since: captured, worth a look
            elif state is not None:
                failed.append(line)
        elif "failed:" in message:
            if _pod_state(facts, event) is not None:
                failed.append(f"{node}: {pod}: {reason}: {message}")
        else:
            repaired.append(f"{node}: {pod}: {reason}: {message}")
    if failed:
        return failure(
            name,
            f"pods refused or not repaired by their node's agent: {len(failed)}",
            "each line says why; `kubectl describe pod` shows the Event, and `kubectl -n <agent "
            "namespace> exec <agent pod on the node> -- istio-cni-agent status` the agent's view",
            failed + differ + repaired,
        )
    if differ:
        return warning(
            name,
            "pods with redirect rules that differ from this release's, or refused before they "
            f"started: {len(differ)}",
            "restart pods whose rules differ (kubectl rollout restart of their workloads) to "
            "get this release's rules; a refusal's reason says what held the pod back",
            differ + repaired,
        )
    note = "no pod refused, left unrepaired or with differing rules"
    return passed(name, note + (f"; {len(repaired)} repaired" if repaired else ""), repaired)


def _pod_state(facts: Facts, event: Mapping[str, Any]) -> str | None:
    """The pod's phase now, None when it is gone (or another pod took its name)."""
    obj = event.get("involvedObject") or {}
    path = f"/api/v1/namespaces/{seg(str(obj.get('namespace')))}/pods/{seg(str(obj.get('name')))}"
    pod = facts.once(("pod", path), lambda: facts.cluster.get(path))
    if pod is None or (obj.get("uid") and pod["metadata"].get("uid") != obj.get("uid")):
        return None
    return str((pod.get("status") or {}).get("phase") or "unknown")
