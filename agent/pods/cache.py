"""A cache of the pods scheduled to this node, kept current by a list + watch on the API server.

    list (spec.nodeName=<node>, from the watch cache) ──► store, resourceVersion
      └─► watch from that resourceVersion ──► ADDED/MODIFIED/DELETED/BOOKMARK into the store
            ├─ server timeout ends the watch ──► watch again from the last resourceVersion
            ├─ 410 Gone (version expired) ─────► list again (consistent: from etcd)
            ├─ error / connection lost ────────► back off, then watch again from the last
            │                                    event's or bookmark's resourceVersion
            ├─ ended in < 1 s with no event ───► an error too (client-go: "very short watch")
            └─ resync period passed (if set) ──► list again

No periodic relist by default, as client-go's informers (Istio's agent among them): a watch
resumed from its last resourceVersion misses nothing, and an expired version (410) lists again.
A relist on a timer cost the API server a list of every namespace per node every few minutes
(bench/README "API server load"). The watch timeout is drawn from [timeout, 2 x timeout), as
client-go's reflector draws it: the agents of a cluster started together (a DaemonSet rollout,
an API server restart) do not all re-watch in the same second ever after. T is 240 s, so a watch
ends (and the staleness gauge moves) within 480 s, under IstioCniPodCacheStale's 600 s.

Objects are kept as slim records of the API's JSON (only the fields the agent reads:
agent.pods.slim). The pod list comes from the API server's watch cache in one answer (a node's
pods); the namespace list, consistent, in pages of LIST_PAGE_SIZE objects. List, watch and GET
read the raw JSON's text, a list item by item (agent.pods.list_body), and of each object build
only what its slim record reads (agent.pods.skim): a fat object's other fields are skipped in
its text, never built, however large its owner made them. A pod not in the cache yet is fetched
with a GET, retried a few times over about two seconds.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from agent.background import BackgroundLoop
from agent.errors import (
    ApiGone,
    ApiLookupError,
    KubeApiError,
    ListVersionExpired,
    ResourceExpired,
    WatchError,
)
from agent.kube import api
from agent.liveness import LIVENESS, Liveness
from agent.pods import list_body, skim, watch_stream
from agent.pods.metrics import CacheMetrics, default_cache_metrics
from agent.pods.retry_backoff import RetryBackoff

log = logging.getLogger(__name__)

FRESH_LIST_SECONDS = 30.0
"""A 410 on a watch from the version a list returned less than this ago is a failure, backed
off (ListVersionExpired): a server or proxy answering every resume so would otherwise be listed
and watched in a loop at the rate limit. Later, the version may simply have aged out."""
Pod = dict[str, Any]
"""A pod as the API server's JSON (metadata, spec, status)."""
Obj = dict[str, Any]
"""Any object as the API server's JSON."""
Listener = Callable[[str, "Obj | None", "Obj | None"], None]
"""Called after each change of the store with (event, old, new): event is add (old None),
update, or delete (new None). Runs in the watch thread: it must only hand the change on."""

HTTP_GONE = 410
LIST_PAGE_SIZE = 500
"""Objects per page of a list: the API server's own chunk for its clients (kubectl's default),
large enough that a node's pods come in one page, small enough that a cluster's namespaces
never sit in memory as one answer."""


class ListWatchCache:
    """Objects of one kind from a background list + watch; subclasses say what to list."""

    kind = "object"
    list_from_watch_cache = False
    """List at resourceVersion 0: the API server answers from its watch cache (the whole list
    at once, pages ignored) with the version that cache holds, as client-go's informers list;
    a consistent list is read from etcd instead, and the watch that follows can be refused
    while the watch cache lags behind that version (504 "Too large resource version")."""

    def __init__(
        self,
        core: Any,
        node_name: str,
        *,
        resync_seconds: float | None = None,
        watch_timeout_seconds: int = 240,
        get_tries: int = 5,
        get_first_delay_seconds: float = 0.125,
        backoff_max_seconds: float = 30.0,
        metrics: CacheMetrics | None = None,
        timeouts: api.Timeouts = api.DEFAULT_TIMEOUTS,
        liveness: Liveness = LIVENESS,
    ) -> None:
        """`core` is a kubernetes CoreV1Api; the timing arguments exist so tests can be quick;
        `timeouts`: the API calls' (from the settings); `liveness`: where the loop's end or
        hang is reported."""
        if not node_name:
            raise ValueError(f"{self.kind} cache: node name is empty (is NODE_NAME set?)")
        self._core = core
        self._node = node_name
        self._resync_seconds = resync_seconds
        self._watch_timeout = watch_timeout_seconds
        self._get_tries = get_tries
        self._get_first_delay = get_first_delay_seconds
        self._backoff_max = backoff_max_seconds
        self._timeouts = timeouts
        self._pods: dict[tuple[str, str], Pod] = {}
        self._changed = threading.Condition()  # guards _pods; notified on every change
        self._synced = threading.Event()
        beat = watch_stream.heartbeat_bound(timeouts, backoff_max_seconds)
        name, cut = f"{self.kind}-cache", self._cut_watch
        self._loop = BackgroundLoop(name, self._run, wake=cut, heartbeat=beat, liveness=liveness)
        self._stopping = self._loop.stopping
        self._next_resync = 0.0
        self._response: Any = None  # the open watch response, so stop() can cut it
        self._response_lock = threading.Lock()
        self._listeners: list[Listener] = []
        self.relists = 0
        self._listed_version: str | None = None
        self._listed_at = -math.inf
        self._watched = False  # the last step watched (not only listed)
        """How many full lists were done (first one included); read by tests and logs."""
        self._consistent_list = False
        """The next list reads etcd (after a 410: the watch cache may not have the version)."""
        self._seen_version: str | None = None
        """The version of the last event or bookmark of the current watch: a watch that breaks
        is resumed from there, as client-go's reflector does, not from where it started."""
        self._metrics = metrics or default_cache_metrics()
        self._metrics.created(self.kind)
        self.reading: skim.Reading = skim.KEEP
        """What is built of each object read (agent.pods.skim): what `_as_obj` keeps of it."""

    def add_listener(self, listener: Listener) -> None:
        """Be told of every change from now on (add before start() to see the first list)."""
        self._listeners.append(listener)

    def _notify(self, changes: list[tuple[str, Obj | None, Obj | None]]) -> None:
        for event, old, new in changes:
            for listener in self._listeners:
                try:
                    listener(event, old, new)
                except Exception:  # a broken listener must not end the watch
                    log.exception("%s cache listener failed", self.kind)

    def _list(self, **options: Any) -> Any:
        raise NotImplementedError

    def _obj_key(self, obj: Obj) -> tuple[str, str]:
        return _key(obj)

    def _as_obj(self, obj: Obj) -> Obj:
        return obj

    def _loads(self, data: bytes) -> Any:
        return skim.loads(data, self.reading)

    # -- service -----------------------------------------------------------------------------

    def start(self) -> None:
        if not self._loop.running():
            self._loop.start()

    def stop(self) -> None:
        self._loop.stop()

    def _cut_watch(self) -> None:
        """Ends the open watch at once (stop() has set `_stopping` first)."""
        with self._response_lock:
            if self._response is not None:
                watch_stream.cut(self._response)

    def ready(self) -> bool:
        """True once the first list of this node's pods is in the cache."""
        return self._synced.is_set()

    # -- lookups -----------------------------------------------------------------------------

    def cached(self, namespace: str, name: str) -> Pod | None:
        """The cached pod, without asking the API server."""
        with self._changed:
            return self._pods.get((namespace, name))

    def list_pods(self) -> list[Pod]:
        """Every cached pod of this node (for repair, which scans them all)."""
        with self._changed:
            return list(self._pods.values())

    def get(self, namespace: str, name: str, uid: str | None = None) -> Pod | None:
        """The pod from the cache, else from a GET retried while it is missing or failing.

        With `uid`, a pod of that name but another uid (a deleted and recreated pod) does not
        count. Returns None when the pod still does not exist after the retries; raises
        ApiLookupError when the API server kept failing. All tries together take at most the
        lookup timeout (kubeApi.lookupTimeoutSeconds) beyond the time to connect, waits for the
        client's throttle (a Retry-After) included: a CNI ADD waits on it.
        """
        delay = self._get_first_delay
        error: Exception | None = None
        deadline = time.monotonic() + self._timeouts.settings.lookupTimeoutSeconds
        for attempt in range(self._get_tries):
            pod = self._matching(self.cached(namespace, name), uid)
            left = deadline - time.monotonic()
            if pod is not None or left <= 0:
                break
            try:
                pod = self._matching(self._read(namespace, name, within=left), uid)
                error = None
            except ApiLookupError as e:
                error = e
            if pod is not None:
                return pod
            if attempt + 1 < self._get_tries:
                self._wait_for_change(min(delay, max(0.0, deadline - time.monotonic())))
                delay *= 2
        if pod is not None:
            return pod
        if error is not None:
            raise error
        return None

    def get_pod(self, namespace: str, name: str, uid: str | None = None) -> Pod | None:
        """`get`, under the name the pod server's PodSource protocol uses."""
        return self.get(namespace, name, uid)

    @staticmethod
    def _matching(pod: Pod | None, uid: str | None) -> Pod | None:
        if pod is None or not uid:
            return pod
        return pod if pod.get("metadata", {}).get("uid") == uid else None

    def _wait_for_change(self, seconds: float) -> None:
        with self._changed:
            self._changed.wait(seconds)

    def _read(self, namespace: str, name: str, *, within: float | None = None) -> Obj | None:
        """GET one object (answered `within` seconds at most); None when it does not exist;
        ApiLookupError when the lookup failed."""
        raise NotImplementedError

    # -- list + watch ------------------------------------------------------------------------

    def _run(self) -> None:
        version: str | None = None
        backoff = RetryBackoff(self._backoff_max)
        while not self._stopping.is_set():
            self._loop.beat()
            try:
                version = self.step(version)
                if self._watched:  # a list alone does not end a run of failures (410s)
                    backoff.succeeded()
            except Exception as e:  # every failure: back off and retry, never end the watch
                if self._stopping.is_set():
                    break
                if isinstance(e, ListVersionExpired):
                    version = None  # list again, after the back-off
                elif version is not None:  # resume from the last event or bookmark (reflector)
                    version = self._seen_version or version
                delay = backoff.failed()
                fields = {"node": self._node, "error": _short(e), "retryIn": f"{delay:.1f}s"}
                log.warning("%s watch failed; retrying", self.kind, extra={"fields": fields})
                self._stopping.wait(delay)
        log.debug("%s cache stopped", self.kind, extra={"fields": {"node": self._node}})

    def step(self, resource_version: str | None) -> str | None:
        """One round of the loop: list when there is no version or a resync is due, else watch.

        Returns the version to continue from; None after a 410 so the next round lists.
        """
        self._watched = False
        if resource_version is None or time.monotonic() >= self._next_resync:
            return self.relist()
        try:
            version = self.watch_once(resource_version)
        except ResourceExpired as e:
            self._consistent_list = True
            just_listed = time.monotonic() - self._listed_at < FRESH_LIST_SECONDS
            if resource_version == self._listed_version and just_listed:
                raise ListVersionExpired(f"{e} (the version the list returned)") from e
            fields = {"node": self._node, "resourceVersion": resource_version, "error": _short(e)}
            log.info("%s watch version expired; listing again", self.kind, extra={"fields": fields})
            return None
        self._watched = True
        return version

    def relist(self) -> str:
        """Replace the cache with a fresh list; returns its version. Listeners hear the difference
        (what a watch that missed events would have told them)."""
        pods, version = self._list_pages()
        with self._changed:
            old = self._pods
            self._pods = pods
            self._changed.notify_all()
        self.relists += 1
        self._listed_version, self._listed_at = version, time.monotonic()
        self._metrics.listed(self.kind, len(pods))
        self._next_resync = (
            math.inf if self._resync_seconds is None else time.monotonic() + self._resync_seconds
        )
        self._synced.set()
        log.info(
            "%s cache listed",
            self.kind,
            extra={"fields": {"node": self._node, "count": len(pods), "resourceVersion": version}},
        )
        if self._listeners:
            self._notify(list_body.differences(old, pods))
        return version

    def _list_pages(self) -> tuple[dict[tuple[str, str], Obj], str]:
        """Every object, page by page (one snapshot); the list's version."""
        objs: dict[tuple[str, str], Obj] = {}
        options: dict[str, Any] = {"limit": LIST_PAGE_SIZE}
        if self.list_from_watch_cache and not self._consistent_list:
            options["resource_version"] = "0"
        while True:
            self._loop.beat()
            answer = api.call(self._list, timeout=self._timeouts.list(), **options)
            try:  # as it streams, item by item (agent.pods.list_body)
                items, body = list_body.read(list_body.chunks(answer), self._as_obj, self.reading)
            except ValueError as e:
                raise KubeApiError(e) from e
            finally:
                getattr(answer, "release_conn", lambda: None)()
            objs.update((self._obj_key(obj), obj) for obj in items)
            meta = body.get("metadata") or {}
            token = meta.get("continue")
            if not token:
                self._consistent_list = False
                return objs, str(meta["resourceVersion"])
            options.pop("resource_version", None)  # a continued list names no version
            options["_continue"] = token

    def watch_once(self, resource_version: str) -> str:
        """Apply watch events from `resource_version` until the server ends the watch.

        Returns the last version seen; raises ResourceExpired on 410 Gone.
        """
        drawn = self._watch_timeout * (1.0 + random.random())
        timeout = max(1, int(min(drawn, self._next_resync - time.monotonic())))
        try:
            response = api.call(
                self._list,
                watch=True,
                allow_watch_bookmarks=True,
                resource_version=resource_version,
                timeout_seconds=timeout,
                timeout=self._timeouts.watch(timeout),
            )
        except ApiGone as e:
            raise ResourceExpired(f"watch from {resource_version}: {e.reason}") from e
        with self._response_lock:
            if self._stopping.is_set():
                watch_stream.cut(response)
            self._response = response
        started, version, self._seen_version = time.monotonic(), resource_version, resource_version
        try:
            try:
                for line in watch_stream.events(response):
                    self._loop.beat()
                    event = watch_stream.decode(line, self.reading)
                    version = self._seen_version = self.apply_event(event, version)
            except Exception as e:
                if not api.is_read_timeout(e):
                    raise
                # Silent past its idle read timeout: resumed at once from where it was, since
                # a quiet cluster's watch looks the same (api.WATCH_IDLE_SECONDS). A server
                # that is gone fails the next watch's connect or request, which backs off.
                fields = {"node": self._node, "version": version}
                log.debug("%s watch quiet; resuming", self.kind, extra={"fields": fields})
                return version
            if version == resource_version:
                watch_stream.check_not_short(started)
            self._metrics.heard(self.kind)  # the server ended the watch: still in touch
            return version
        finally:
            with self._response_lock:
                self._response = None
            response.release_conn()

    def apply_event(self, event: dict[str, Any], version: str) -> str:
        """Apply one watch event to the store; returns the version it brings."""
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            code = obj.get("code")
            message = str(obj.get("message", ""))[:200]
            if code == HTTP_GONE:
                raise ResourceExpired(message)
            raise WatchError(f"watch error {code}: {message}")
        new_version = str(obj.get("metadata", {}).get("resourceVersion") or version)
        if kind in ("ADDED", "MODIFIED"):
            obj = self._as_obj(obj)
            with self._changed:
                old = self._pods.get(self._obj_key(obj))
                self._pods[self._obj_key(obj)] = obj
                self._changed.notify_all()
            self._notify([("add" if old is None else "update", old, obj)])
        elif kind == "DELETED":
            with self._changed:
                old = self._pods.pop(self._obj_key(obj), None)
                self._changed.notify_all()
            self._notify([("delete", old or self._as_obj(obj), None)])
        elif kind != "BOOKMARK":
            log.debug("ignored watch event", extra={"fields": {"type": kind}})
        self._metrics.changed(self.kind, len(self._pods))
        return new_version


def _key(pod: dict[str, Any]) -> tuple[str, str]:
    meta = pod.get("metadata", {})
    return str(meta.get("namespace", "")), str(meta.get("name", ""))


def _short(error: BaseException) -> str:
    error = api.original(error)  # as the client words it
    text = f"{type(error).__name__}: {error}"
    return text if len(text) <= 300 else text[:297] + "..."
