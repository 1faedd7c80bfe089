"""Warning Events on pods, sent off the caller's thread, deduplicated and rate-limited.

A pod whose ADD is refused is retried by the runtime every few seconds for as long as it is
wanted: a crash-looping or unstartable pod must not become an Event per try. As client-go's
event correlator does, one Event per (pod UID, reason) is created and its repeats counted on
it: `count` and `lastTimestamp` patched at most once per `repeat_interval`. All API calls share
one token bucket (`burst`, then one per `refill_seconds`); what waits for a token waits in a
bounded table, and a new key past `max_keys` is dropped and counted
(istio_cni_events_dropped_total). The Event's name is derived from the pod's name and UID, the
reason and the node, so an agent restarted meanwhile patches the same Event instead of making
another; it is a valid name whatever the pod's (`event_name`).
`record` never blocks on the API server: the ADD that caused it answers at once.
"""

from __future__ import annotations

import datetime
import hashlib
import logging
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter

from agent.background import BackgroundLoop
from agent.errors import ApiConflict, ApiNotFound, KubeApiError
from agent.excerpt import bounded
from agent.kube import api

log = logging.getLogger(__name__)

IDLE_TURN_SECONDS = 5.0
"""The longest the sender waits with nothing due before its heartbeat's turn (agent.liveness)."""

MAX_MESSAGE = 1024
MAX_NAME = 253
"""An Event's name is a DNS-1123 subdomain: at most 253 characters."""
_NOT_IN_NAME = re.compile(r"[^a-z0-9-]")
COMPONENT = "istio-cni"
EVENTS_SENT = Counter(
    "istio_cni_events_sent", "Pod Events sent to the API server, by call.", ["call"]
)
EVENTS_DROPPED = Counter(
    "istio_cni_events_dropped",
    "Pod Events not sent: too many distinct ones waiting, or the API server refused them.",
)


@dataclass
class _Entry:
    namespace: str
    pod: str
    uid: str
    reason: str
    message: str
    name: str
    count: int = 1
    sent: int = 0
    """`count` as last written to the API server (0: not created yet)."""
    sent_at: float = -1e18
    first: str = ""
    last: str = ""


def event_name(pod: str, uid: str, reason: str, node: str) -> str:
    """`<pod>.<digest>`: a DNS-1123 subdomain of at most MAX_NAME characters (what the API
    server accepts as an Event's name), one per (pod, UID, reason, node). The pod's name is
    cut to fit and made a valid prefix; the digest, of the whole name, keeps two pods whose
    names were cut alike apart."""
    key = f"{pod}\0{uid}\0{reason}\0{node}"
    digest = hashlib.sha256(key.encode(errors="surrogatepass")).hexdigest()[:16]
    prefix = _subdomain_prefix(pod, MAX_NAME - len(digest) - 1)
    return f"{prefix}.{digest}" if prefix else digest


def _subdomain_prefix(name: str, limit: int) -> str:
    """`name` as the start of a DNS-1123 subdomain of at most `limit` characters: lower case,
    any other character a `-`, each dot-separated label starting and ending alphanumeric."""
    labels = (_NOT_IN_NAME.sub("-", label.lower()).strip("-") for label in name.split("."))
    return ".".join(label for label in labels if label)[:limit].rstrip(".-")


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class EventRecorder:
    """Service: `record` queues, one thread sends."""

    def __init__(
        self,
        core: Any,
        *,
        node_name: str,
        timeouts: api.Timeouts = api.DEFAULT_TIMEOUTS,
        repeat_interval: float = 60.0,
        burst: int = 20,
        refill_seconds: float = 1.0,
        max_keys: int = 512,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._core = core
        self._node = node_name
        self._timeouts = timeouts
        self._repeat = repeat_interval
        self._burst = burst
        self._refill = refill_seconds
        self._max_keys = max_keys
        self._clock = clock
        self._tokens = float(burst)
        self._tokens_at = clock()
        self._entries: OrderedDict[tuple[str, str], _Entry] = OrderedDict()
        self._cond = threading.Condition()
        # A turn waits at most IDLE_TURN_SECONDS, then sends one Event: a create, or a patch
        # and a create, each within the API's update timeout (retries inside it).
        send = 2 * (api.CONNECT_SECONDS + timeouts.settings.updateTimeoutSeconds)
        self._loop = BackgroundLoop("events", self._run, wake=self._wake, heartbeat=2 * send + 30.0)

    def record(self, pod: Mapping[str, Any], *, reason: str, message: str) -> None:
        meta = pod.get("metadata") or {}
        namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        uid = str(meta.get("uid") or "")
        if not (namespace and name):
            return
        key = (uid or f"{namespace}/{name}", reason)
        text = bounded(message, MAX_MESSAGE)
        with self._cond:
            entry = self._entries.get(key)
            if entry is not None:
                entry.count += 1
                entry.message, entry.last = text, _now()
            elif len(self._entries) >= self._max_keys and not self._evict_sent():
                EVENTS_DROPPED.inc()
                return
            else:
                stamp = _now()
                self._entries[key] = _Entry(
                    namespace, name, uid, reason, text,
                    event_name(name, uid, reason, self._node), first=stamp, last=stamp,
                )  # fmt: skip
            self._cond.notify()

    def _evict_sent(self) -> bool:
        """Make room by forgetting the oldest Event with nothing left to send."""
        for key, entry in self._entries.items():
            if entry.sent == entry.count:
                del self._entries[key]
                return True
        return False

    def start(self) -> None:
        self._loop.start()

    def stop(self) -> None:
        self._loop.stop()

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify()

    def _run(self) -> None:
        stopping = self._loop.stopping
        while True:
            with self._cond:
                entry, wait = self._next()
                while entry is None and not stopping.is_set():
                    self._loop.beat()
                    self._cond.wait(
                        IDLE_TURN_SECONDS if wait is None else min(wait, IDLE_TURN_SECONDS)
                    )
                    entry, wait = self._next()
                if stopping.is_set() or entry is None:
                    return
                self._tokens -= 1
                create = entry.sent == 0
                count, entry.sent, entry.sent_at = entry.count, entry.count, self._clock()
            self._send(entry, count, create=create)

    def _next(self) -> tuple[_Entry | None, float | None]:
        """The next Event due with a token free, else (None, how long to wait; None: forever)."""
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._tokens_at) / self._refill)
        self._tokens_at = now
        soonest: float | None = None
        for entry in self._entries.values():
            if entry.sent == entry.count:
                continue
            due = 0.0 if entry.sent == 0 else entry.sent_at + self._repeat - now
            if due <= 0:
                if self._tokens >= 1:
                    return entry, None
                due = (1 - self._tokens) * self._refill
            soonest = due if soonest is None else min(soonest, due)
        return None, soonest

    def _send(self, entry: _Entry, count: int, *, create: bool) -> None:
        try:
            if create:
                self._create(entry, count)
            else:
                try:
                    self._patch(entry, count)
                except ApiNotFound:  # expired (the API server's event TTL): anew
                    self._create(entry, count)
        except KubeApiError as e:
            EVENTS_DROPPED.inc()
            log.warning(
                "cannot record event %s for pod %s/%s: %s",
                entry.reason, entry.namespace, entry.pod, e,
            )  # fmt: skip

    def _create(self, entry: _Entry, count: int) -> None:
        try:
            api.call(
                self._core.create_namespaced_event,
                entry.namespace,
                self._body(entry, count),
                timeout=self._timeouts.update(),
                raw=False,
            )
            EVENTS_SENT.labels(call="create").inc()
        except ApiConflict:  # made before the agent restarted: count on it
            self._patch(entry, count)

    def _patch(self, entry: _Entry, count: int) -> None:
        patch = {"count": count, "lastTimestamp": entry.last, "message": entry.message}
        api.call(
            self._core.patch_namespaced_event,
            entry.name,
            entry.namespace,
            patch,
            timeout=self._timeouts.update(),
            raw=False,
        )
        EVENTS_SENT.labels(call="patch").inc()

    def _body(self, entry: _Entry, count: int) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": entry.name, "namespace": entry.namespace},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": entry.pod,
                "namespace": entry.namespace,
                "uid": entry.uid or None,
            },
            "reason": entry.reason,
            "message": entry.message,
            "type": "Warning",
            "source": {"component": COMPONENT, "host": self._node},
            "reportingComponent": COMPONENT,
            "reportingInstance": self._node,
            "firstTimestamp": entry.first,
            "lastTimestamp": entry.last,
            "count": count,
        }
