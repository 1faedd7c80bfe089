"""The pods scheduled to this node: a ListWatchCache (agent.pods.cache) of slim pod records
(agent.pods.slim), from which the pod server answers ADDs."""

from __future__ import annotations

from typing import Any

from agent.errors import ApiLookupError, ApiNotFound, KubeApiError
from agent.kube import api
from agent.pods.cache import ListWatchCache, Obj, Pod
from agent.pods.slim import PodFields, pod_shape, reading_of, slim


class PodCache(ListWatchCache):
    """Pods on `node_name`, from a background list + watch; `get` answers ADDs from it."""

    kind = "pod"
    # A node's pods are few (kubelet's max pods) and the watch cache indexes pods by node: one
    # answer from memory costs the API server little, where a consistent list reads etcd. With
    # 1,000 nodes starting, consistent lists then watches were refused by the hundreds
    # (bench/README "API server load").
    list_from_watch_cache = True

    def __init__(
        self, core: Any, node_name: str, *, fields: PodFields | None = None, **kw: Any
    ) -> None:
        """`fields`: what the settings make the agent read of a pod (agent.pods.slim); the
        other arguments are ListWatchCache's."""
        super().__init__(core, node_name, **kw)
        self._shape = pod_shape(fields or PodFields())
        self.reading = reading_of(self._shape)

    def _list(self, **options: Any) -> Any:
        return self._core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={self._node}", **options
        )

    def _as_obj(self, obj: Obj) -> Obj:
        return _as_pod(slim(obj, self._shape))

    def _read(self, namespace: str, name: str, *, within: float | None = None) -> Pod | None:
        try:
            return self._as_obj(
                api.get_json(
                    self._core.read_namespaced_pod,
                    name,
                    namespace,
                    timeout=self._timeouts.lookup(within),
                    loads=self._loads,
                )
            )
        except ApiNotFound:
            return None
        except KubeApiError as e:
            raise ApiLookupError(f"get pod {namespace}/{name}: {e}") from e


def _as_pod(obj: dict[str, Any]) -> Pod:
    # List items carry no kind; a GET does. Make both look the same.
    obj.setdefault("apiVersion", "v1")
    obj.setdefault("kind", "Pod")
    return obj
