"""What the agent last did to each pod of its node, as `istio-cni-agent status` lists it.

The pod server notes each ADD's outcome (captured, skipped, refused, with why), repair notes
what it did (repaired, repair failed, rules differ). Ambient's record is its own (the mesh's
enrolled set); the status report asks it directly. Kept per pod UID, the latest outcome of
each kind, until the pod is deleted (`on_pod`, a pod cache listener); bounded besides: the
oldest entries go first when a node holds more pods than `limit`.
Reasons may quote pod values: they are stored as given and escaped where they are shown.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

CAPTURED = "captured"
SKIPPED = "skipped"
REFUSED = "refused"
REPAIRED = "repaired"
REPAIR_FAILED = "repair-failed"
RULES_DIFFER = "rules-differ"

ADD = "add"
REPAIR = "repair"
KINDS = (ADD, REPAIR)

MAX_REASON = 2048
"""A reason kept at most this long (a refusal quotes an excerpt of the refused value)."""


@dataclass(frozen=True)
class Outcome:
    state: str
    reason: str
    at: float
    """Wall-clock time (time.time()) it happened."""


@dataclass(frozen=True)
class PodRecord:
    namespace: str
    name: str
    uid: str
    outcomes: dict[str, Outcome]
    """ADD or REPAIR -> its latest outcome."""


class PodStates:
    """uid -> PodRecord, safe to use from the pod server's threads and repair's."""

    def __init__(self, *, limit: int = 4096, clock: Callable[[], float] = time.time) -> None:
        self._lock = threading.Lock()
        self._items: OrderedDict[str, PodRecord] = OrderedDict()
        self._limit = limit
        self._clock = clock

    def note(
        self, *, namespace: str, name: str, uid: str, kind: str, state: str, reason: str
    ) -> None:
        """Record `kind`'s latest outcome for the pod (a pod without a UID is keyed by name)."""
        key = uid or f"{namespace}/{name}"
        outcome = Outcome(state, reason[:MAX_REASON], self._clock())
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None and (old.namespace, old.name) != (namespace, name):
                old = None  # a UID reused by a pod of another name cannot inherit its record
            outcomes = dict(old.outcomes) if old is not None else {}
            outcomes[kind] = outcome
            self._items[key] = PodRecord(namespace, name, uid, outcomes)
            while len(self._items) > self._limit:
                self._items.popitem(last=False)

    def get(self, uid: str, namespace: str = "", name: str = "") -> PodRecord | None:
        with self._lock:
            found = self._items.get(uid) if uid else None
            if found is None:
                found = self._items.get(f"{namespace}/{name}")
            return found

    def on_pod(self, event: str, old: Any, new: Any) -> None:
        """A pod cache listener (agent.pods.cache.Listener): a pod gone from the API takes its
        record with it, so the records follow the node's pods rather than pile up to `limit`
        under churn (a node creating and deleting pods all day held thousands)."""
        if event != "delete" or not isinstance(old, Mapping):
            return
        meta = old.get("metadata")
        if not isinstance(meta, Mapping):
            return
        keys = [meta.get("uid"), f"{meta.get('namespace')}/{meta.get('name')}"]
        with self._lock:
            for key in keys:  # by UID, and a record by name of an ADD that found no pod
                if isinstance(key, str) and key:
                    self._items.pop(key, None)

    def forget_except(self, live: set[str]) -> None:
        """Drop the records of pods no longer on the node (by UID; name-keyed ones kept)."""
        with self._lock:
            for key in [k for k in self._items if "/" not in k and k not in live]:
                del self._items[key]

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)
