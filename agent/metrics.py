"""Prometheus metrics of the agent (default registry, served on /metrics). Istio's names where
Istio has one."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

INSTALL_READY = Gauge(
    "istio_cni_install_ready",
    "1 while the plugin binary and its CNI config entry are in place and valid, else 0.",
)
INSTALLS = Counter(
    "istio_cni_installs",
    "Install runs (start-up and every repair), by result.",
    ["result"],
)
HEALS = Counter(
    "istio_cni_install_heals",
    "Times the agent put back a binary or config entry that something removed or changed.",
    ["kind"],
)
CONFLICTS = Counter(
    "istio_cni_install_conflicts",
    "Heals that undid another writer's change to a CNI config file, by file.",
    ["file"],
)
INSTALL_READY_SINCE = Gauge(
    "istio_cni_install_ready_timestamp_seconds",
    "Unix time the install last became ready (0: never since the agent started).",
)
RULES_APPLY_FAILURES = Counter(
    "istio_cni_rules_apply_failures",
    "Failures to program a pod's redirect rules (plugin ADD and repair), by rule backend.",
    ["backend"],
)

# Ambient mode (Istio's cni/pkg/nodeagent names).
RECONCILE_EVENTS = Counter(
    "nodeagent_reconcile_events",
    "The total number of node agent reconcile events.",
    ["type"],
)
# ztunnel_connected is the ZDS server's (agent.ambient.zds.ZdsMetrics).
