"""A cache of the cluster's Namespaces (their labels decide ambient enrollment), kept current by
the same list + watch loop as the pod cache."""

from __future__ import annotations

import json
from typing import Any

import urllib3
from kubernetes.client.exceptions import ApiException

from agent.pods.cache import HTTP_NOT_FOUND, ListWatchCache, Obj, PodLookupError

Namespace = dict[str, Any]


class NamespaceCache(ListWatchCache):
    """Every Namespace (not only this node's: a pod may land in any); keyed ("", name)."""

    kind = "namespace"

    def _list(self, **options: Any) -> Any:
        return self._core.list_namespace(**options)

    def get_namespace(self, name: str, *, retry: bool = True) -> Namespace | None:
        """The namespace from the cache, else from a GET (retried while missing or failing
        unless `retry` is off). None when it does not exist; PodLookupError when the API
        server kept failing."""
        if retry:
            return self.get("", name)
        return self.cached("", name) or self._read("", name)

    def cached_namespace(self, name: str) -> Namespace | None:
        return self.cached("", name)

    def _read(self, namespace: str, name: str) -> Obj | None:
        try:
            response = self._core.read_namespace(
                name, _preload_content=False, _request_timeout=(2, 5)
            )
            found: Obj = json.loads(response.data)
            return found
        except ApiException as e:
            if e.status == HTTP_NOT_FOUND:
                return None
            raise PodLookupError(
                f"get namespace {name}: API server answered {e.status} {e.reason}"
            ) from e
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as e:
            raise PodLookupError(f"get namespace {name}: {e}") from e
