"""The agent's own DaemonSet, watched while the agent runs, so that the stop policy can still
know it was deleted when the API server no longer answers the agent at SIGTERM.

`helm uninstall` deletes the DaemonSet, then, within the same second, the ServiceAccount and
RBAC: by the time the kubelet stops the agent its calls are refused (401/403), and a refusal is
no answer (agent.install.stop_policy). The watch hears the DaemonSet's deletion first (the
garbage collector deletes the pods only after it has seen it too); that deletion is the API
server's own word, given while the agent's credentials still counted.

One object, by name (`fieldSelector=metadata.name=`): the Role grants get, list and watch on
that name only. Kept: its name, uid and deletion timestamp.

Only a connected watch hears the deletion: one that was down at that moment resumes after the
credentials are gone, and is refused. So this watch retries at most BACKOFF_MAX_SECONDS apart,
not the caches' 30 s: after a connectivity blip (every connection reset, the back-off grown by
each failed retry) it is back within about 2.4 s, and a `helm uninstall` that follows is heard.
Each retry is one watch of one object by name, resumed from the API server's watch cache. An
uninstall within those seconds, or while the agent cannot reach the API server, is not heard:
the agent keeps the plugin (fail closed) and says so.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from agent.pods.cache import ListWatchCache, Obj
from agent.pods.metrics import CacheMetrics

BACKOFF_MAX_SECONDS = 2.0
"""The longest wait between tries (before jitter) while the watch cannot be opened."""


class OwnDaemonSetWatch(ListWatchCache):
    """DaemonSet `name` in `namespace` (the agent pod's), by list + watch; `gone()` says
    whether the API server told of its deletion (or replacement) since the first list."""

    kind = "daemonset"

    def __init__(self, apps: Any, *, name: str, namespace: str, **options: Any) -> None:
        """`apps`: agent.kube.rest.AppsV1; `options`: ListWatchCache's. Its gauges stay out of
        the agent's metrics (one object: nothing to chart)."""
        options.setdefault("metrics", CacheMetrics(CollectorRegistry()))
        options.setdefault("backoff_max_seconds", BACKOFF_MAX_SECONDS)
        super().__init__(apps, name, **options)
        self.name, self.namespace = name, namespace
        self._first_uid = ""

    @classmethod
    def for_pod(cls, apps: Any, pod_name: str, namespace: str, **options: Any) -> OwnDaemonSetWatch:
        """The DaemonSet by the name it gave the agent's pod (`<name>-xxxxx`)."""
        return cls(apps, name=pod_name.rsplit("-", 1)[0], namespace=namespace, **options)

    def _list(self, **options: Any) -> Any:
        return self._core.list_namespaced_daemon_set(
            self.namespace, field_selector=f"metadata.name={self.name}", **options
        )

    def _as_obj(self, obj: Obj) -> Obj:
        meta = obj.get("metadata") or {}
        kept = ("name", "namespace", "uid", "resourceVersion", "deletionTimestamp")
        return {"metadata": {k: meta[k] for k in kept if k in meta}}

    def _read(self, namespace: str, name: str, *, within: float | None = None) -> Obj | None:
        return self.cached(namespace, name)

    def relist(self) -> str:
        version = super().relist()
        if not self._first_uid:
            found = self.cached(self.namespace, self.name)
            self._first_uid = str((found or {}).get("metadata", {}).get("uid") or "")
        return version

    def gone(self) -> str:
        """Why the DaemonSet first seen is gone, as the API server told it; "" while it is
        there or nothing was heard (not listed yet, or it did not exist at the first list)."""
        if not self.ready() or not self._first_uid:
            return ""
        found = self.cached(self.namespace, self.name)
        if found is None:
            return "its watch saw the DaemonSet deleted"
        meta = found.get("metadata") or {}
        if meta.get("uid") != self._first_uid:
            return "its watch saw the DaemonSet deleted and another made in its name"
        if meta.get("deletionTimestamp"):
            return "its watch saw the DaemonSet being deleted"
        return ""
