"""The checks of an installed chart, per DaemonSet: it exists and can create its pods, an agent
on every node it should be on, one image across them, every agent Ready, the plugin entry in
place on each node."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agent.check.agents import NodeAgent, survey
from agent.check.facts import AGENT_SELECTOR, Facts
from agent.check.platform import ENFORCE_LABEL
from agent.check.published import CONFLICT, agent_events
from agent.check.result import Result, failure, passed, warning
from agent.check.scheduling import TAINT

CHECK_FIXES = {
    "install": "the agent's log names the missing file; set cniBinDir/cniConfDir to the "
    "runtime's (values-examples/<platform>.yaml)",
    "cni-dirs": "a CNI dir the agent mounts was deleted and made again on the node: the agent "
    "fails its liveness probe and kubelet restarts it, which mounts the new dir; if it does not "
    "recover, delete the agent pod",
    "pod-socket": "the plugin's socket under cniAgentRunDir does not answer: see the agent's log",
    "api": "the agent cannot list its node's pods: check the node reaches the API server and "
    "the chart's ClusterRole is bound",
    "netns-dir": "set cniNetnsDir to where the node's runtime keeps pod network namespaces",
    "cni-bin-dir": "set cniBinDir to the runtime's CNI bin dir (values-examples/<platform>.yaml)",
    "rules": "the node cannot program redirect rules (iptables/nftables, kernel modules): see "
    "the agent's log and ruleBackend",
    "ambient": "the ZDS server for ztunnel does not listen: see the agent's log",
}


def _name(ds: Mapping[str, Any]) -> str:
    return f"{ds['metadata']['namespace']}/{ds['metadata']['name']}"


def _ns_name(ds: Mapping[str, Any]) -> tuple[str, str]:
    return str(ds["metadata"]["namespace"]), str(ds["metadata"]["name"])


def daemonset(facts: Facts, ds: Mapping[str, Any]) -> Result:
    name = "daemonset"
    ns, ds_name = _ns_name(ds)
    agents = [a for a in survey(facts, ds) if a.excluded is None]
    ready = sum(1 for a in agents if a.ready)
    summary = f"{_name(ds)}: {ready} of {len(agents)} agents Ready"
    events = facts.events(
        f"involvedObject.kind=DaemonSet,involvedObject.name={ds_name},reason=FailedCreate", ns
    )
    if not events:
        return passed(name, summary)
    last = max(events, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))
    message = str(last.get("message") or "")
    if "PodSecurity" in message:
        fix = f"kubectl label namespace {ns} {ENFORCE_LABEL}=privileged --overwrite"
    elif "quota" in message:
        fix = "helm upgrade <release> ... --reuse-values --set resourceQuota.enabled=true"
    else:
        fix = f"kubectl -n {ns} describe daemonset {ds_name}"
    return failure(
        name,
        f"{summary}; the DaemonSet cannot create its pods ({last.get('count') or 1} times)",
        fix,
        [message],
    )


def missing_daemonset(facts: Facts) -> Result:
    where = f"namespace {facts.namespace}" if facts.namespace else "any namespace"
    return failure(
        "daemonset",
        f"no istio-cni DaemonSet (label {AGENT_SELECTOR}) in {where}",
        'helm install istio-cni charts/istio-cni -n kube-system (README "Install"), or name '
        "its namespace with -n",
    )


def coverage(facts: Facts, ds: Mapping[str, Any]) -> Result:
    name = "coverage"
    agents = survey(facts, ds)
    missing: list[str] = []
    tainted: list[str] = []
    notes: list[str] = []
    for a in agents:
        down = "" if a.node_ready else " (node not Ready)"
        if a.excluded is not None:
            line = f"{a.node}: no agent by design: {a.excluded.why}"
            (tainted if a.excluded.kind == TAINT else notes).append(line)
        elif a.pod is None:
            missing.append(f"{a.node}: no agent pod: the DaemonSet has not made one{down}")
        elif a.why and a.why[0].startswith("not scheduled"):
            missing.append(f"{a.node}: agent pod {a.pod_name} {a.why[0]}{down}")
    served = sum(1 for a in agents if a.excluded is None)
    message = f"{served - len(missing)} of {served} nodes that should run an agent have one"
    ns, ds_name = _ns_name(ds)
    if missing:
        return failure(
            name,
            message,
            f"kubectl -n {ns} describe daemonset {ds_name} (its events say why a pod was not "
            "made); meshed pods on these nodes cannot start",
            missing + tainted + notes,
        )
    if tainted:
        return warning(
            name,
            message + f"; {len(tainted)} tainted nodes get none: meshed pods that tolerate the "
            "taint start there without the plugin",
            "add a toleration for the taint (value `tolerations`), or keep meshed pods off "
            "those nodes",
            tainted + notes,
        )
    return passed(name, message, notes)


def versions(facts: Facts, ds: Mapping[str, Any]) -> Result:
    name = "agent-version"
    containers = (((ds.get("spec") or {}).get("template") or {}).get("spec") or {}).get(
        "containers"
    ) or []
    wanted = next((str(c.get("image")) for c in containers if c.get("image")), "")
    by_image: dict[str, list[str]] = {}
    for a in survey(facts, ds):
        if a.pod is not None:
            by_image.setdefault(a.image, []).append(a.node)
    old = {image: nodes for image, nodes in by_image.items() if image != wanted}
    if not old:
        return passed(name, f"every agent runs {wanted}")
    ns, ds_name = _ns_name(ds)
    details = [f"{image}: {', '.join(sorted(nodes))}" for image, nodes in sorted(by_image.items())]
    strategy = ((ds.get("spec") or {}).get("updateStrategy") or {}).get("type")
    fix = f"kubectl -n {ns} rollout status daemonset/{ds_name}"
    if strategy == "OnDelete":
        fix = f"updateStrategy is OnDelete: delete the old agents' pods node by node ({fix})"
    return warning(
        name, f"{len(by_image)} images across the agents; the DaemonSet's is {wanted}", fix, details
    )


def readiness(facts: Facts, ds: Mapping[str, Any]) -> Result:
    name = "readiness"
    agents = [a for a in survey(facts, ds) if a.pod is not None]
    bad = [a for a in agents if not a.ready]
    if not bad:
        return passed(name, f"every agent is Ready ({len(agents)})")
    ns = ds["metadata"]["namespace"]
    return failure(
        name,
        f"{len(bad)} of {len(agents)} agents not Ready: pods cannot start on their nodes",
        _readiness_fix(bad, ns),
        [f"{a.node}: {a.pod_name}: {'; '.join(a.why)}" for a in bad],
    )


def _readiness_fix(bad: Sequence[NodeAgent], ns: str) -> str:
    named = sorted({check for a in bad for check in a.failing or {}})
    fixes = [f"{check}: {CHECK_FIXES.get(check, 'see the agent log')}" for check in named]
    if any(a.failing is None for a in bad):
        fixes.append(
            f"read an agent's failing checks with `kubectl -n {ns} logs POD | grep 'readiness "
            f"check fails'` or `kubectl get --raw /api/v1/namespaces/{ns}/pods/POD:15014/proxy/"
            "readyz`"
        )
    return "; ".join(fixes)


def plugin_entry(facts: Facts, ds: Mapping[str, Any]) -> Result:
    name = "plugin-entry"
    agents = [a for a in survey(facts, ds) if a.pod is not None]
    failing, unknown = [], []
    for a in agents:
        if a.ready:
            continue
        if a.failing is not None and "install" in a.failing:
            failing.append(f"{a.node}: {a.failing['install']}")
        elif a.failing is None:
            unknown.append(f"{a.node}: not confirmed: its agent is not Ready")
    fights = [f"{node}: {msg}" for node, msg in agent_events(facts, ds, CONFLICT)]
    confirmed = len(agents) - len(failing) - len(unknown)
    message = f"the plugin and its entry are in place on {confirmed} of {len(agents)} nodes"
    if failing:
        return failure(name, message, CHECK_FIXES["install"], failing + unknown + fights)
    if fights or unknown:
        fixes = ["see `readiness` for the agents that are not Ready"] if unknown else []
        if fights:
            fixes.append("stop the other writer rewriting the CNI config (the event names it)")
        fix = "; ".join(fixes)
        return warning(name, message + _fight_note(fights), fix, unknown + fights)
    return passed(name, message)


def _fight_note(fights: Sequence[str]) -> str:
    return f"; another writer keeps removing it on {len(fights)} nodes" if fights else ""
