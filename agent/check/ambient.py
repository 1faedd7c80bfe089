"""Ambient pods whose redirection the agent left `pending`: its rules are in the pod, but the
node's ztunnel has not taken the pod (the agent's `ambient.istio.io/redirection` annotation,
written on pods/status; `enabled` once ztunnel acknowledged it). Read from the pods Istio's
default selectors enrol: labelled `istio.io/dataplane-mode=ambient`, or in a namespace so
labelled (a custom `ambient.enablementSelectors` is not read here)."""

from __future__ import annotations

from typing import Any

from agent.check.facts import Facts, seg
from agent.check.result import Result, passed, warning

MODE_LABEL = "istio.io/dataplane-mode"
REDIRECTION = "ambient.istio.io/redirection"
"""agent.ambient.enrollment's names (tests/check asserts they are equal)."""


def ambient_pods(facts: Facts) -> list[dict[str, Any]]:
    selector = f"{MODE_LABEL}=ambient"
    namespaces = facts.once(
        ("ambient-ns",), lambda: facts.cluster.items("/api/v1/namespaces", labelSelector=selector)
    )
    found: dict[str, dict[str, Any]] = {}
    lists = [facts.once(("ambient-pods",), lambda: facts.cluster.items(
        "/api/v1/pods", labelSelector=selector))]  # fmt: skip
    for ns in namespaces:
        path = f"/api/v1/namespaces/{seg(ns['metadata']['name'])}/pods"
        lists.append(facts.once(("pods-in", path), lambda p=path: facts.cluster.items(p)))
    for pod in (p for listed in lists for p in listed):
        found[str(pod["metadata"].get("uid"))] = pod
    return list(found.values())


def pending(facts: Facts) -> Result:
    name = "ambient"
    pods = ambient_pods(facts)
    waiting = sorted(
        f"{(p.get('spec') or {}).get('nodeName') or '?'}: "
        f"{p['metadata']['namespace']}/{p['metadata']['name']}"
        for p in pods
        if ((p["metadata"].get("annotations") or {}).get(REDIRECTION)) == "pending"
        and (p.get("status") or {}).get("phase") == "Running"
    )
    if not waiting:
        return passed(name, f"no ambient pod waits for ztunnel ({len(pods)} ambient pods)")
    return warning(
        name,
        f"ambient pods whose traffic is redirected but not yet taken by ztunnel: {len(waiting)}",
        "check ztunnel on those nodes (kubectl -n istio-system get pods -l app=ztunnel -o wide, "
        "and its log); the agent hands the pods over once it connects",
        waiting,
    )
