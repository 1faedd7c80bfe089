"""Live enrollment: pod and namespace changes, as Istio's informers see them (cni/pkg/nodeagent
informers.go), queued and applied to the mesh dataplane one at a time, retried until they work.

    pod cache ──(update, delete)──┐
                                  ├──► keyed queue ──► worker: enrollment ──► MeshDataplane
    namespace cache ──(add, label ┘         ▲            failure: back off, retry the key
      change) ──► its pods as updates       └────────────(5 ms doubling to 5 s, as Istio's queue)

The queue holds one item per pod (by UID) and per namespace (agent.ambient.workqueue): the
updates of a pod waiting for its turn, or for its back-off, merge into that one item, whose
handling reads the pod's latest state from the cache. A pod updated a thousand times while
ztunnel is away costs as much as a pod updated once.

One pod never stops the watch: whatever fails for it is retried for that pod alone (logged once
per distinct reason, then at debug level), and a pod the mesh will not capture (NonRetryableAdd)
is logged once per distinct reason, not once per update.

Pod adds need nothing (the CNI ADD enrolls new pods); on start-up every namespace arrives as an
add, so every pod on the node is examined once: pods that should be enrolled and are not (they
started before the agent, or their namespace was labelled meanwhile) are enrolled live, and a
pod whose `ambient.istio.io/redirection` annotation is not its state (found enrolled without
it, the annotation removed by hand, a stale claim) gets its state's annotation; so does any
pod whose annotation is changed later.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from agent.ambient.enrollment import (
    RedirectionState,
    is_ztunnel_pod,
    namespace_change_matters,
    pod_update_action,
    release_on_delete,
)
from agent.ambient.workqueue import KeyedQueue, Taken
from agent.background import BackgroundLoop
from agent.errors import NonRetryableAdd
from agent.label_selectors import EnablementSelector

log = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 120.0
"""The worker's heartbeat bound (agent.liveness): a turn waits 0.5 s for an item and handles one
pod (a ZDS request acked within 5 s, the pod's annotation patched within the API's 12 s and its
netns programmed), some 20 s at the longest; a namespace's change only queues its pods."""

Obj = dict[str, Any]
Key = tuple[str, str]
"""("pod", uid) or ("namespace", name): what one pending item stands for."""


class Mesh(Protocol):
    def state(self, uid: str) -> RedirectionState: ...
    def add(self, pod: Mapping[str, Any], *, unless_enabled: bool = False) -> object: ...
    def remove(self, pod: Mapping[str, Any], *, deleted: bool) -> None: ...
    def sync_host_probe(self, pod: Mapping[str, Any]) -> None: ...
    def annotate_as_recorded(self, pod: Mapping[str, Any]) -> None: ...
    def forget(self, uid: str) -> None: ...


class Pods(Protocol):
    def cached(self, namespace: str, name: str) -> Obj | None: ...
    def list_pods(self) -> list[Obj]: ...


class Namespaces(Protocol):
    def cached_namespace(self, name: str) -> Obj | None: ...


@dataclass(frozen=True)
class Event:
    """One informer event: kind pod|namespace, type add|update|delete (Istio's names)."""

    kind: str
    type: str
    old: Obj | None
    new: Obj | None

    @property
    def latest(self) -> Obj:
        return self.new if self.new is not None else (self.old or {})

    @property
    def key(self) -> Key:
        meta = _meta(self.latest)
        if self.kind == "namespace":
            return ("namespace", str(meta.get("name", "")))
        return ("pod", str(meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}"))


def merge(older: Event, newer: Event) -> Event:
    """One pending event per object: the `old` of the first (what the object was when the last
    handled event left it) and the `new` of the latest; a delete ends the object, so it wins."""
    if newer.type == "delete":
        return newer
    if older.type == "delete":
        return older
    type_ = "add" if "add" in (older.type, newer.type) else newer.type
    return Event(newer.kind, type_, older.old, newer.new)


def _meta(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    meta = (obj or {}).get("metadata")
    return meta if isinstance(meta, Mapping) else {}


class AmbientWatch:
    """Feed it with `on_pod` / `on_namespace` (cache listeners); `start` runs the worker."""

    def __init__(
        self,
        *,
        pods: Pods,
        namespaces: Namespaces,
        mesh: Mesh,
        selectors: Sequence[EnablementSelector],
        exclude_namespaces: Collection[str],
        system_namespace: str,
        on_event: Callable[[str], None] | None = None,
    ) -> None:
        """`on_event(type)` counts each reconcile (nodeagent_reconcile_events_total)."""
        self._pods = pods
        self._namespaces = namespaces
        self._mesh = mesh
        self._selectors = tuple(selectors)
        self._exclude = frozenset(exclude_namespaces)
        self._system_ns = system_namespace
        self._on_event = on_event
        self._queue: KeyedQueue[Key, Event] = KeyedQueue(merge)
        self._loop = BackgroundLoop(
            "ambient-watch", self._run, wake=self._queue.wake, heartbeat=HEARTBEAT_SECONDS
        )
        self._failing: dict[Key, str] = {}
        """Key -> the failure last logged for it, until its item is handled."""
        self._not_captured: dict[str, str] = {}
        """Pod UID -> why the mesh last would not capture it (logged once per reason)."""
        self.processed = 0
        """Events handled without error (tests wait on it)."""

    # -- inputs (cache listeners) ------------------------------------------------------------

    def on_pod(self, type_: str, old: Obj | None, new: Obj | None) -> None:
        if type_ != "add":  # Istio: a pod add needs nothing
            self._put(Event("pod", type_, old, new))

    def on_namespace(self, type_: str, old: Obj | None, new: Obj | None) -> None:
        if type_ != "delete":
            self._put(Event("namespace", type_, old, new))

    def _put(self, event: Event) -> None:
        # A delete is due at once: the pod is gone, whatever back-off its updates were in.
        self._queue.put(event.key, event, at_once=event.type == "delete")

    # -- service -----------------------------------------------------------------------------

    def start(self) -> None:
        self._loop.start()

    def stop(self) -> None:
        self._loop.stop()

    def pending(self) -> int:
        """Objects waiting to be handled (one item per pod or namespace)."""
        return len(self._queue)

    def _run(self) -> None:
        while not self._loop.stopping.is_set():
            self._loop.beat()
            taken = self._queue.get(0.5)
            if taken is not None:
                self.step(taken)

    def next_item(self, timeout: float = 0.0) -> Taken[Key, Event] | None:
        """The next due item, for a test driving the worker's steps itself."""
        return self._queue.get(timeout)

    def step(self, taken: Taken[Key, Event]) -> None:
        """Handle one item; on failure it is queued again after its key's back-off."""
        event = taken.value
        try:
            self.handle(event)
        except Exception as e:  # retried with back-off, forever, as Istio's queue
            delay = self._queue.retry(taken)
            again = self._failing.get(taken.key) == str(e)
            self._failing[taken.key] = str(e)
            (log.debug if again else log.warning)(
                "ambient event failed; retrying",
                extra={
                    "fields": {
                        "kind": event.kind,
                        "type": event.type,
                        "object": _ref(event.latest),
                        "error": str(e),
                        "retryIn": f"{delay:.3f}s",
                    }
                },
            )
            return
        self._failing.pop(taken.key, None)
        self.processed += 1

    # -- reconcile ---------------------------------------------------------------------------

    def handle(self, event: Event) -> None:
        """Istio's reconcile of one event; raises to have it retried."""
        if self._on_event is not None:
            self._on_event(event.type)
        if event.kind == "namespace":
            self._namespace(event)
        else:
            self._pod(event)

    def _namespace(self, event: Event) -> None:
        ns = event.latest
        if event.new is None or not namespace_change_matters(
            None if event.type == "add" else event.old, event.new, self._selectors
        ):
            return
        name = str(_meta(ns).get("name", ""))
        log.info(
            "namespace changed; examining its pods",
            extra={"fields": {"namespace": name, "excluded": name in self._exclude}},
        )
        for pod in self._pods.list_pods():
            if _meta(pod).get("namespace") == name and not is_ztunnel_pod(pod, self._system_ns):
                self._put(Event("pod", "update", pod, pod))

    def _pod(self, event: Event) -> None:
        latest = event.latest
        meta = _meta(latest)
        ns_name, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        namespace = self._namespaces.cached_namespace(ns_name)
        state = self._mesh.state(str(meta.get("uid", "")))
        if event.type == "delete":
            # The namespace may be gone with its pods: the agent's record still tells.
            if release_on_delete(latest, namespace, self._selectors, state=state):
                self._mesh.remove(latest, deleted=True)
            else:  # nothing to release: what the mesh still keeps of the pod goes
                self._mesh.forget(str(meta.get("uid", "")))
            self._not_captured.pop(str(meta.get("uid", "")), None)
            return
        if namespace is None:
            log.warning(
                "namespace of pod not found; event skipped",
                extra={"fields": {"pod": f"{ns_name}/{name}"}},
            )
            return
        current = self._pods.cached(ns_name, name)
        if current is None or _meta(current).get("uid") != meta.get("uid"):
            return  # gone meanwhile: its delete event releases it
        action = pod_update_action(
            current,
            namespace,
            self._selectors,
            state=state,
            old_pod=event.old,
            exclude_namespaces=self._exclude,
            system_namespace=self._system_ns,
        )
        log.debug(
            "pod update",
            extra={
                "fields": {
                    "pod": f"{ns_name}/{name}",
                    "action": action.action,
                    "reason": action.reason,
                }
            },
        )
        if action.action == "add":
            self._add(current)
        elif action.action == "remove":
            self._mesh.remove(current, deleted=False)
        elif action.action == "remove-deleted":
            self._mesh.remove(event.old or current, deleted=True)
        elif action.action == "sync-host-probe":
            self._mesh.sync_host_probe(current)
        elif action.action == "annotate":
            self._mesh.annotate_as_recorded(current)

    def _add(self, pod: Obj) -> None:
        uid = str(_meta(pod).get("uid", ""))
        try:
            self._mesh.add(pod, unless_enabled=True)  # decided on a state read before its lock
        except NonRetryableAdd as e:
            if self._not_captured.get(uid) != str(e):
                self._not_captured[uid] = str(e)
                log.error(
                    "failed capturing pod, will not retry",
                    extra={"fields": {"pod": _ref(pod), "error": str(e)}},
                )
            return
        self._not_captured.pop(uid, None)


def _ref(obj: Mapping[str, Any]) -> str:
    meta = _meta(obj)
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}".lstrip("/")
