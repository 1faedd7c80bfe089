"""What the checks read, each read once per run and shared (`Facts`), with the names the
chart gives its objects."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from agent.check.cluster import Cluster

DEFAULT_NAMESPACE = "kube-system"
"""Where the README installs the chart; `--pre` checks this namespace unless told another."""
AGENT_SELECTOR = "app.kubernetes.io/component=cni-node-agent"
"""The label of this chart's DaemonSet (templates/_helpers.tpl: istio-cni.labels)."""
AGENT_CONTAINER = "istio-cni-agent"


def seg(value: str) -> str:
    return quote(value, safe="")


def label_selector(match_labels: Mapping[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(match_labels.items()))


class Facts:
    """Lazy, cached reads for one run. `namespace`: the chart's namespace (None: any)."""

    def __init__(self, cluster: Cluster, namespace: str | None) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self._cache: dict[tuple[str, ...], Any] = {}

    def once(self, key: tuple[str, ...], read: Any) -> Any:
        """`read()`, the first time `key` is asked for; its answer afterwards."""
        if key not in self._cache:
            self._cache[key] = read()
        return self._cache[key]

    @property
    def target_namespace(self) -> str:
        return self.namespace or DEFAULT_NAMESPACE

    def version(self) -> dict[str, Any]:
        return dict(self.once(("version",), lambda: self.cluster.get("/version") or {}))

    def nodes(self) -> list[dict[str, Any]]:
        return list(self.once(("nodes",), lambda: self.cluster.items("/api/v1/nodes")))

    def namespace_object(self, name: str) -> dict[str, Any] | None:
        path = f"/api/v1/namespaces/{seg(name)}"
        found: dict[str, Any] | None = self.once(("ns", name), lambda: self.cluster.get(path))
        return found

    def daemonsets(self) -> list[dict[str, Any]]:
        """This chart's DaemonSets (in `namespace`, or anywhere)."""
        where = f"/namespaces/{seg(self.namespace)}" if self.namespace else ""
        path = f"/apis/apps/v1{where}/daemonsets"
        return list(
            self.once(("ds",), lambda: self.cluster.items(path, labelSelector=AGENT_SELECTOR))
        )

    def all_daemonsets(self, name: str) -> list[dict[str, Any]]:
        """DaemonSets named `name` in any namespace."""
        return list(
            self.once(
                ("ds-named", name),
                lambda: self.cluster.items(
                    "/apis/apps/v1/daemonsets", fieldSelector=f"metadata.name={name}"
                ),
            )
        )

    def pods_of(self, ds: Mapping[str, Any]) -> list[dict[str, Any]]:
        meta, spec = ds["metadata"], ds.get("spec") or {}
        selector = label_selector((spec.get("selector") or {}).get("matchLabels") or {})
        path = f"/api/v1/namespaces/{seg(meta['namespace'])}/pods"
        return list(
            self.once(
                ("pods", meta["namespace"], meta["name"]),
                lambda: self.cluster.items(path, labelSelector=selector),
            )
        )

    def configmaps_named(self, name: str) -> list[dict[str, Any]]:
        return list(
            self.once(
                ("cm", name),
                lambda: self.cluster.items(
                    "/api/v1/configmaps", fieldSelector=f"metadata.name={name}"
                ),
            )
        )

    def configmaps_labelled(self, selector: str) -> list[dict[str, Any]]:
        return list(
            self.once(
                ("cm-l", selector),
                lambda: self.cluster.items("/api/v1/configmaps", labelSelector=selector),
            )
        )

    def events(self, field_selector: str, namespace: str | None = None) -> list[dict[str, Any]]:
        where = f"/namespaces/{seg(namespace)}" if namespace else ""
        path = f"/api/v1{where}/events"
        return list(
            self.once(
                ("events", namespace or "", field_selector),
                lambda: self.cluster.items(path, fieldSelector=field_selector),
            )
        )

    def quotas(self, namespace: str) -> list[dict[str, Any]]:
        path = f"/api/v1/namespaces/{seg(namespace)}/resourcequotas"
        return list(self.once(("quota", namespace), lambda: self.cluster.items(path)))

    def is_gke(self) -> bool:
        if "-gke." in str(self.version().get("gitVersion") or ""):
            return True
        return any(
            "cloud.google.com/gke-nodepool" in ((n.get("metadata") or {}).get("labels") or {})
            for n in self.nodes()
        )
