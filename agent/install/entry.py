"""Our plugin entry in the node's CNI config: everything the plugin needs, no credential."""

from __future__ import annotations

from typing import Any

from agent.config import Settings

PLUGIN_TYPE = "istio-cni"
STANDALONE_CNI_VERSION = "1.0.0"


def plugin_entry(settings: Settings, *, pod_name: str, pod_namespace: str) -> dict[str, Any]:
    """The entry chained into the primary conflist (libcni injects name/cniVersion of the list)."""
    return {
        "name": PLUGIN_TYPE,
        "type": PLUGIN_TYPE,
        "plugin_log_level": settings.logLevel,
        "cni_agent_run_dir": settings.cniAgentRunDir,
        "exclude_namespaces": list(settings.excludeNamespaces),
        "pod_namespace": pod_namespace,
        "pod_name": pod_name,
    }


def standalone_entry(settings: Settings, *, pod_name: str, pod_namespace: str) -> dict[str, Any]:
    """The same entry as a network config of its own (chained: false)."""
    return {
        "cniVersion": STANDALONE_CNI_VERSION,
        **plugin_entry(settings, pod_name=pod_name, pod_namespace=pod_namespace),
    }
