"""Our plugin entry in the node's CNI config: everything the plugin needs, no credential.

The entry depends on the settings only, never on the agent's pod: a DaemonSet rollout replaces
the pod, and must not rewrite the node's primary CNI config (every write is a moment another
writer can race, and a change the container runtime reloads). So the agent's own pods are named
by their namespace and the DaemonSet's pod name prefix (Istio: namespace plus `istio-cni-node-`),
not by one pod's name.
"""

from __future__ import annotations

from typing import Any

from agent.config import Settings

PLUGIN_TYPE = "istio-cni"
STANDALONE_CNI_VERSION = "1.0.0"
POD_ANNOTATIONS = "io.kubernetes.cri.pod-annotations"
"""The capability that makes containerd hand the plugin the pod's annotations
(`runtimeConfig`): with the agent unreachable, a plain pod of a sidecar-only install then still
starts (plugin/plain.py)."""
MAX_GENERATED_PREFIX = 58
"""The API server cuts a generateName to 63 - 5 characters before appending its 5 random ones."""


def daemonset_name(settings: Settings, pod_name: str) -> str:
    """`daemonSetName`, or (a config without it) the agent pod's name without its `-xxxxx`."""
    if settings.daemonSetName:
        return settings.daemonSetName
    base, sep, _suffix = pod_name.rpartition("-")
    return base if sep else ""


def agent_pod_prefix(settings: Settings, pod_name: str) -> str:
    """What the names of the DaemonSet's pods start with (before their 5-character suffix)."""
    name = daemonset_name(settings, pod_name)
    return (name + "-")[:MAX_GENERATED_PREFIX] if name else ""


def plugin_entry(settings: Settings, *, pod_name: str, pod_namespace: str) -> dict[str, Any]:
    """The entry chained into the primary conflist (libcni injects name/cniVersion of the list).

    `pod_name` (the agent's pod) only stands in for a missing `daemonSetName`."""
    entry: dict[str, Any] = {
        "name": PLUGIN_TYPE,
        "type": PLUGIN_TYPE,
        "plugin_log_level": settings.log_levels.plugin,
        "cni_agent_run_dir": settings.cniAgentRunDir,
        "exclude_namespaces": list(settings.excludeNamespaces),
        "pod_namespace": pod_namespace,
        # Istio's field, read by the plugin only while the agent is unreachable: ambient pods
        # are enrolled by labels the plugin never sees, so it then passes no pod.
        "ambient_enabled": settings.ambient.enabled,
        "capabilities": {POD_ANNOTATIONS: True},
    }
    prefix = agent_pod_prefix(settings, pod_name)
    if prefix:
        entry["agent_pod_prefix"] = prefix
    if settings.logAsJson:
        entry["log_as_json"] = True
    return entry


def standalone_entry(settings: Settings, *, pod_name: str, pod_namespace: str) -> dict[str, Any]:
    """The same entry as a network config of its own (chained: false)."""
    return {
        "cniVersion": STANDALONE_CNI_VERSION,
        **plugin_entry(settings, pod_name=pod_name, pod_namespace=pod_namespace),
    }
