"""Istio around the agent: whether istiod injects for CNI (the setting its injector's own
template reads, from the `istio-sidecar-injector[-REV]` ConfigMap), and whether Istio's own node
agent (`istio-cni-node`) is installed."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent.check.facts import AGENT_SELECTOR, Facts
from agent.check.result import Result, failure, passed, warning

INJECTOR = "istio-sidecar-injector"
ISTIO_AGENT = "istio-cni-node"
MIGRATION = "the README's \"Migrating from Istio's CNI on a live cluster\""
SWITCH_ON = (
    "Helm: helm upgrade istiod-<rev> istio/istiod -n istio-system --reuse-values --set "
    "pilot.cni.enabled=true; istioctl: values.pilot.cni.enabled=true with "
    "components.cni.enabled=false; then restart the meshed workloads"
)


@dataclass(frozen=True)
class Injector:
    where: str
    """namespace/name of the ConfigMap."""
    setting: str
    """The value the injection template reads: pilot.cni.enabled or istio_cni.enabled."""
    enabled: bool | None
    """None: the values do not say."""


def injectors(facts: Facts) -> list[Injector]:
    seen: dict[str, Mapping[str, Any]] = {}
    for cm in [*facts.configmaps_labelled("istio.io/rev"), *facts.configmaps_named(INJECTOR)]:
        meta = cm.get("metadata") or {}
        if str(meta.get("name", "")).startswith(INJECTOR):
            seen[f"{meta.get('namespace')}/{meta.get('name')}"] = cm
    return [_injector(where, cm) for where, cm in sorted(seen.items())]


def _injector(where: str, cm: Mapping[str, Any]) -> Injector:
    data = cm.get("data") or {}
    template = str(data.get("config") or "")
    legacy = "istio_cni.enabled" in template and "pilot.cni.enabled" not in template
    setting = "istio_cni.enabled" if legacy else "pilot.cni.enabled"
    try:
        values = json.loads(str(data.get("values") or "{}"))
    except ValueError:
        values = {}
    node: Any = values
    for key in setting.split(".")[:-1]:
        node = node.get(key) if isinstance(node, dict) else None
    enabled = node.get("enabled") if isinstance(node, dict) else None
    return Injector(where, setting, enabled if isinstance(enabled, bool) else None)


def istiod_cni(facts: Facts, *, installed: bool) -> Result:
    name = "istiod-cni"
    found = injectors(facts)
    if not found:
        return warning(
            name,
            f"no istiod found (no ConfigMap {INJECTOR}[-<rev>]): nothing injects pods for CNI",
            'install istiod with pilot.cni.enabled=true (the README\'s "Using it with Istio")',
        )
    details = [f"{i.where}: {i.setting}={_word(i.enabled)}" for i in found]
    off = [i for i in found if i.enabled is not True]
    if not off:
        if installed:
            return passed(name, "istiod injects pods for CNI (istio-validation)", details)
        if istio_agents(facts):
            return passed(name, "on: Istio's agent serves it now; keep it on while migrating")
        return warning(
            name,
            "istiod injects istio-validation but no CNI agent is installed: new meshed pods "
            "fail validation until this agent is Ready",
            "install this chart now",
            details,
        )
    if not installed:
        return passed(name, "off: switch it on once the agents are Ready on every node", details)
    return failure(
        name,
        "istiod still injects istio-init (CNI off): the agent leaves those pods to it",
        SWITCH_ON,
        details,
    )


def _word(value: bool | None) -> str:
    return "unset" if value is None else str(value).lower()


def istio_agents(facts: Facts) -> list[dict[str, Any]]:
    """Istio's own node agent's DaemonSets (by name, and not this chart's)."""
    ours = AGENT_SELECTOR.split("=")
    return [
        ds
        for ds in facts.all_daemonsets(ISTIO_AGENT)
        if ((ds.get("metadata") or {}).get("labels") or {}).get(ours[0]) != ours[1]
    ]


def istio_node_agent(facts: Facts, *, installed: bool) -> Result:
    name = "istio-node-agent"
    found = istio_agents(facts)
    if not found:
        return passed(name, f"Istio's own node agent is not installed (no DaemonSet {ISTIO_AGENT})")
    details = [_how(ds) for ds in found]
    message = (
        "Istio's node agent is installed: it and this one install the same plugin and entry"
        + (", and fight over them on every node" if installed else "; only one may run")
    )
    return failure(name, message, _migration(found[0]), details)


def _how(ds: Mapping[str, Any]) -> str:
    meta = ds.get("metadata") or {}
    ready = (ds.get("status") or {}).get("numberReady", 0)
    return f"{meta.get('namespace')}/{meta.get('name')}: {_installer(ds)}, {ready} pods ready"


def _installer(ds: Mapping[str, Any]) -> str:
    meta = ds.get("metadata") or {}
    labels, notes = meta.get("labels") or {}, meta.get("annotations") or {}
    release = notes.get("meta.helm.sh/release-name") or labels.get("release")
    if labels.get("app.kubernetes.io/managed-by") == "Helm" or notes.get(
        "meta.helm.sh/release-name"
    ):
        return f"Helm release {release}"
    if labels.get("install.operator.istio.io/owning-resource", "unknown") != "unknown":
        return "istioctl / IstioOperator"
    return f"release {release}" if release else "installed by an unknown tool"


def _migration(ds: Mapping[str, Any]) -> str:
    meta = ds.get("metadata") or {}
    ns, how = meta.get("namespace"), _installer(ds)
    if how.startswith("istioctl"):
        step = (
            "istioctl install with components.cni.enabled=false "
            "(values.pilot.cni.enabled stays true)"
        )
    else:
        release = how.split()[-1] if "release" in how else "<release>"
        step = f"helm uninstall {release} -n {ns}"
    return (
        f"follow {MIGRATION}: taint the nodes cni.istio.io/not-ready=true:NoSchedule, wait until "
        f"no pod is Pending there, remove Istio's agent ({step}), then install this chart with "
        "--set removeNotReadyTaint=true"
    )
