"""The cluster around the agent: the namespace's Pod Security level, GKE's quota for
node-critical pods, Cilium's `cni-exclusive`, and the Kubernetes version against the chart's."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from agent.check.facts import Facts
from agent.check.result import Result, failure, passed, warning

CHART_KUBE_VERSION = ">=1.29.0-0"
"""charts/istio-cni/Chart.yaml's `kubeVersion` (tests/check asserts they are equal)."""
ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"
PRIORITY_CLASS = "system-node-critical"
"""The chart's default `priorityClassName`."""
CILIUM_CONFIG = "cilium-config"


def pod_security(facts: Facts, namespaces: Sequence[str]) -> Result:
    name = "pod-security"
    notes, bad = [], []
    for ns in namespaces:
        obj = facts.namespace_object(ns)
        if obj is None:
            notes.append(f"{ns}: does not exist yet; made by `helm install --create-namespace`")
            continue
        level = ((obj.get("metadata") or {}).get("labels") or {}).get(ENFORCE_LABEL)
        if level is None:
            notes.append(f"{ns}: no {ENFORCE_LABEL} label: the cluster's default level applies")
        elif level != "privileged":
            bad.append(f"{ns}: {ENFORCE_LABEL}={level}")
    if bad:
        return failure(
            name,
            "the agent's pod needs the `privileged` Pod Security level (host network, host "
            "paths, NET_ADMIN and SYS_ADMIN); the namespace enforces a stricter one",
            "kubectl label namespace "
            + " ".join(b.split(":")[0] for b in bad)
            + f" {ENFORCE_LABEL}=privileged --overwrite",
            bad,
        )
    return passed(name, "the namespace admits privileged pods", notes)


def priority_quota(facts: Facts, namespaces: Sequence[str], *, installed: bool) -> Result:
    """GKE admits system-node-critical pods outside kube-system only in a namespace with a
    ResourceQuota scoped to that PriorityClass."""
    name = "priority-quota"
    if not facts.is_gke():
        return passed(name, "not needed: not a GKE cluster")
    missing = [
        ns for ns in namespaces if ns != "kube-system" and not _admits_critical(facts.quotas(ns))
    ]
    if not missing:
        return passed(name, f"{PRIORITY_CLASS} pods are admitted in {', '.join(namespaces)}")
    message = (
        f"GKE admits {PRIORITY_CLASS} pods outside kube-system only with a ResourceQuota scoped "
        f"to that PriorityClass; none in {', '.join(missing)}"
    )
    fix = (
        "install with -f values-examples/gke.yaml (or --set resourceQuota.enabled=true), which "
        "makes the quota, or install into kube-system"
    )
    if installed:
        fix = "helm upgrade <release> ... --reuse-values --set resourceQuota.enabled=true"
        return failure(name, message + ": the DaemonSet cannot create its pods", fix)
    return warning(name, message, fix)


def _admits_critical(quotas: Sequence[Mapping[str, Any]]) -> bool:
    for quota in quotas:
        selector = (quota.get("spec") or {}).get("scopeSelector") or {}
        for expr in selector.get("matchExpressions") or []:
            if (
                expr.get("scopeName") == "PriorityClass"
                and expr.get("operator") == "In"
                and PRIORITY_CLASS in (expr.get("values") or [])
            ):
                return True
    return False


def cilium_exclusive(facts: Facts) -> Result:
    name = "cilium-exclusive"
    configs = facts.configmaps_named(CILIUM_CONFIG)
    if not configs:
        return passed(name, "no Cilium (no ConfigMap cilium-config)")
    exclusive = [
        c["metadata"]["namespace"]
        for c in configs
        if str((c.get("data") or {}).get("cni-exclusive", "")).lower() == "true"
    ]
    if not exclusive:
        return passed(name, "Cilium leaves other CNI config entries alone (cni-exclusive off)")
    where = ", ".join(f"{ns}/{CILIUM_CONFIG}" for ns in exclusive)
    return failure(
        name,
        f'Cilium runs with cni-exclusive: "true" ({where}): it deletes istio-cni\'s entry '
        "from the node's CNI config, so pods start without the plugin",
        "helm upgrade cilium cilium/cilium -n <its namespace> --reuse-values --set "
        "cni.exclusive=false, then `kubectl -n <its namespace> rollout restart ds/cilium`",
    )


def kubernetes_version(facts: Facts) -> Result:
    name = "kubernetes-version"
    git = str(facts.version().get("gitVersion") or "")
    found = parse_version(git)
    if found is None:
        return warning(name, f"cannot read the cluster's version ({git!r})", "")
    if satisfies(found, CHART_KUBE_VERSION):
        return passed(name, f"{git} meets the chart's kubeVersion {CHART_KUBE_VERSION}")
    return failure(
        name,
        f"{git} is older than the chart supports ({CHART_KUBE_VERSION}): helm install refuses it",
        "upgrade the cluster first (the README's support matrix lists the tested versions)",
    )


def parse_version(text: str) -> tuple[int, int, int] | None:
    """major, minor, patch of `v1.29.3` or `v1.29.3-gke.100` (a provider's suffix ignored)."""
    match = re.match(r"v?(\d+)\.(\d+)(?:\.(\d+))?", text.strip())
    if match is None:
        return None
    return int(match[1]), int(match[2]), int(match[3] or 0)


def satisfies(version: tuple[int, int, int], constraint: str) -> bool:
    """Comparators (`>=1.29.0-0`, `<1.40`), comma or space separated, all to hold; a `-0`
    pre-release mark (providers' versions count) is ignored."""
    for part in re.split(r"[,\s]+", constraint.strip()):
        if not part:
            continue
        match = re.fullmatch(r"(>=|<=|>|<|=|==|!=)?v?([\d.]+)(?:-[\w.]+)?", part)
        if match is None:
            raise ValueError(f"unsupported version constraint {part!r}")
        op, bound = match[1] or "=", parse_version(match[2])
        assert bound is not None
        ok = {
            ">=": version >= bound, "<=": version <= bound, ">": version > bound,
            "<": version < bound, "=": version == bound, "==": version == bound,
            "!=": version != bound,
        }[op]  # fmt: skip
        if not ok:
            return False
    return True
