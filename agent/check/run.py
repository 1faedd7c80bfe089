"""The checks of a run, before install or after, each run alone: a read it needed that failed
becomes its warning, so one refused read never hides the other checks' verdicts."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from agent.check import ambient, istio, platform, postinstall, published
from agent.check.cluster import ReadError
from agent.check.facts import Facts
from agent.check.result import Result, warning

Check = tuple[str, Callable[[], Result]]
FORBIDDEN_FIX = (
    "the kubeconfig's user may not read it: run as a cluster admin, or grant get/list on "
    "nodes, namespaces, pods, events, configmaps, resourcequotas, daemonsets and pods/proxy"
)


COULD_NOT = "could not check: "


def unread(results: Sequence[Result]) -> bool:
    """No check could read what it needed (the version, which anyone may read, aside): the
    kubeconfig's user may read nothing."""
    others = [r for r in results if r.name != "kubernetes-version"]
    return bool(others) and all(r.message.startswith(COULD_NOT) for r in others)


def run(checks: Sequence[Check]) -> list[Result]:
    results = []
    for name, check in checks:
        try:
            results.append(check())
        except ReadError as e:
            fix = FORBIDDEN_FIX if e.status in (401, 403) else "run the check again"
            results.append(warning(name, f"{COULD_NOT}{e}", fix))
    return results


def preinstall(facts: Facts) -> list[Result]:
    target = [facts.target_namespace]
    return run(
        [
            ("kubernetes-version", lambda: platform.kubernetes_version(facts)),
            ("pod-security", lambda: platform.pod_security(facts, target)),
            (
                "priority-quota",
                lambda: platform.priority_quota(facts, target, installed=False),
            ),
            ("istio-node-agent", lambda: istio.istio_node_agent(facts, installed=False)),
            ("cilium-exclusive", lambda: platform.cilium_exclusive(facts)),
            ("istiod-cni", lambda: istio.istiod_cni(facts, installed=False)),
        ]
    )


def postinstall_checks(facts: Facts) -> list[Result]:
    try:
        daemonsets = facts.daemonsets()
    except ReadError as e:
        return run([("daemonset", _raise(e)), *_cluster_checks(facts, [])])
    if not daemonsets:
        return [postinstall.missing_daemonset(facts), *run(_cluster_checks(facts, []))]
    checks: list[Check] = []
    for ds in daemonsets:
        checks += _agent_checks(facts, ds, suffix=len(daemonsets) > 1)
    namespaces = sorted({str(ds["metadata"]["namespace"]) for ds in daemonsets})
    return run(checks + _cluster_checks(facts, namespaces))


def _agent_checks(facts: Facts, ds: dict[str, Any], *, suffix: bool) -> list[Check]:
    tail = f" ({ds['metadata']['namespace']}/{ds['metadata']['name']})" if suffix else ""
    each = [
        ("daemonset", postinstall.daemonset),
        ("coverage", postinstall.coverage),
        ("agent-version", postinstall.versions),
        ("readiness", postinstall.readiness),
        ("plugin-entry", postinstall.plugin_entry),
    ]
    return [(name + tail, _bind(fn, facts, ds)) for name, fn in each]


def _bind(fn: Callable[[Facts, Any], Result], facts: Facts, ds: Any) -> Callable[[], Result]:
    return lambda: fn(facts, ds)


def _raise(error: Exception) -> Callable[[], Result]:
    def check() -> Result:
        raise error

    return check


def _cluster_checks(facts: Facts, namespaces: list[str]) -> list[Check]:
    checks: list[Check] = [
        ("istiod-cni", lambda: istio.istiod_cni(facts, installed=True)),
        ("istio-node-agent", lambda: istio.istio_node_agent(facts, installed=True)),
        ("cilium-exclusive", lambda: platform.cilium_exclusive(facts)),
        ("pods", lambda: published.pods(facts)),
        ("ambient", lambda: ambient.pending(facts)),
        ("kubernetes-version", lambda: platform.kubernetes_version(facts)),
    ]
    if namespaces:
        checks[:0] = [
            ("pod-security", lambda: platform.pod_security(facts, namespaces)),
            (
                "priority-quota",
                lambda: platform.priority_quota(facts, namespaces, installed=True),
            ),
        ]
    return checks
