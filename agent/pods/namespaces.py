"""A cache of the cluster's Namespaces (their labels decide ambient enrollment), kept current by
the same list + watch loop as the pod cache. Every namespace of the cluster is kept (a pod may
land in any), each as its name and labels only (agent.pods.slim.NAMESPACE)."""

from __future__ import annotations

from typing import Any

from agent.errors import ApiLookupError, ApiNotFound, KubeApiError
from agent.kube import api
from agent.pods.cache import ListWatchCache, Obj
from agent.pods.slim import NAMESPACE, reading_of, slim

Namespace = dict[str, Any]


class NamespaceCache(ListWatchCache):
    """Every Namespace (not only this node's: a pod may land in any); keyed ("", name)."""

    kind = "namespace"

    def _list(self, **options: Any) -> Any:
        return self._core.list_namespace(**options)

    def __init__(self, core: Any, node_name: str, **kw: Any) -> None:
        super().__init__(core, node_name, **kw)
        self.reading = reading_of(NAMESPACE)

    def _as_obj(self, obj: Obj) -> Obj:
        slimmed: Obj = slim(obj, NAMESPACE)
        return slimmed

    def get_namespace(self, name: str, *, retry: bool = True) -> Namespace | None:
        """The namespace from the cache, else from a GET (retried while missing or failing
        unless `retry` is off). None when it does not exist; ApiLookupError when the API
        server kept failing."""
        if retry:
            return self.get("", name)
        return self.cached("", name) or self._read("", name)

    def read_namespace(self, name: str) -> Namespace | None:
        """The namespace from the API server now (one GET, not cached: the watch brings it);
        None when it does not exist; ApiLookupError when the API server failed."""
        return self._read("", name)

    def cached_namespace(self, name: str) -> Namespace | None:
        return self.cached("", name)

    def _read(self, namespace: str, name: str, *, within: float | None = None) -> Obj | None:
        timeout = self._timeouts.lookup(within)
        try:
            answer = api.get_json(
                self._core.read_namespace, name, timeout=timeout, loads=self._loads
            )
            return self._as_obj(answer)
        except ApiNotFound:
            return None
        except KubeApiError as e:
            raise ApiLookupError(f"get namespace {name}: {e}") from e
