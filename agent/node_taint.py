"""Take the taint `cni.istio.io/not-ready` off this node once the agent is ready (opt-in:
`removeNotReadyTaint`).

A node can join the cluster with that taint (kubelet `--register-with-taints`, a node pool's
template) so that no pod is scheduled before the CNI plugin is in place. Istio removes it with
istiod's node-untaint controller (pilot/pkg/controllers/untaint): once the istio-cni pod on a node
is Ready, it deletes every taint with that key, whatever its effect, with a JSON patch that first
`test`s `/spec/taints` against the list it read and then `replace`s it without ours, so a
concurrent change to the node's taints fails the patch instead of being lost. This service does
the same from the agent itself, for its own node (NODE_NAME): "ready" is the condition /readyz
reports (plugin binary and config entry in place, plugin socket served).

It runs in its own thread and never holds the agent up: API errors are retried with exponential
backoff until the taint is gone, a failed `test` (another writer changed the taints) re-reads and
retries at once, a taint that is not there is success. It is checked again each time the agent
turns ready after having been not ready. With the setting off the service does not exist and the
node is never read or written.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from agent.background import BackgroundLoop
from agent.errors import ApiConflict, KubeApiError, TaintChanged
from agent.kube import api

log = logging.getLogger(__name__)

TAINT_KEY = "cni.istio.io/not-ready"
"""Istio's default PILOT_NODE_UNTAINT_CONTROLLERS_TAINT_NAME."""


@dataclass(frozen=True)
class TaintTiming:
    ready_poll_seconds: float = 0.5
    """How often readiness is looked at while waiting for it (or for it to be lost)."""
    initial_backoff_seconds: float = 1.0
    """First wait after an API error; doubled per failure."""
    max_backoff_seconds: float = 60.0
    """Longest wait between attempts."""
    immediate_retries: int = 5
    """Re-reads right after a failed `test` before backing off (a node whose taints keep
    changing is retried too, only slower)."""


def without_key(taints: Sequence[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    """`taints` minus every taint with `key` (any value, any effect), order kept."""
    return [t for t in taints if t.get("key") != key]


def removal_patch(taints: Sequence[dict[str, Any]], key: str) -> list[dict[str, Any]] | None:
    """The JSON patch taking `key` off a node whose taints are `taints` (None: nothing to do).

    As istiod's untaint controller: `test` the whole list as read, then `replace` it, so the
    patch only applies to the list we decided on."""
    remaining = without_key(taints, key)
    if len(remaining) == len(taints):
        return None
    return [
        {"op": "test", "path": "/spec/taints", "value": list(taints)},
        {"op": "replace", "path": "/spec/taints", "value": remaining},
    ]


def remove_taint(
    core: Any, node_name: str, key: str = TAINT_KEY, timeouts: api.Timeouts = api.DEFAULT_TIMEOUTS
) -> list[str]:
    """One attempt: read the node, patch the taint away. Returns the removed taints' effects
    (empty: there was none). Raises TaintChanged when the taints changed meanwhile (a 422: the
    JSON patch's `test` failed; 409: conflict), and KubeApiError when the API server cannot be
    asked."""
    node = api.get_json(core.read_node, node_name, timeout=timeouts.node())
    taints: list[dict[str, Any]] = (node.get("spec") or {}).get("taints") or []
    patch = removal_patch(taints, key)
    if patch is None:
        return []
    try:
        api.call(
            core.patch_node,
            node_name,
            patch,
            _content_type="application/json-patch+json",
            timeout=timeouts.node(),
            raw=False,  # read and released: the connection goes back to the pool
        )
    except ApiConflict as e:
        raise TaintChanged(f"HTTP {e.status}: {e.message}") from None
    return [str(t.get("effect", "")) for t in taints if t.get("key") == key]


class Stopping(Protocol):
    """What the retries wait on (a threading.Event): tests count the back-off waits."""

    def is_set(self) -> bool: ...

    def wait(self, timeout: float) -> bool: ...


class NodeTaintRemover:
    """Service: removes TAINT_KEY from `node_name` each time `is_ready` becomes true."""

    def __init__(
        self,
        core: Any,
        node_name: str,
        *,
        is_ready: Callable[[], bool],
        key: str = TAINT_KEY,
        timing: TaintTiming | None = None,
        timeouts: api.Timeouts = api.DEFAULT_TIMEOUTS,
    ) -> None:
        self._core = core
        self._timeouts = timeouts
        self.node_name = node_name
        self._is_ready = is_ready
        self.key = key
        self.timing = timing or TaintTiming()
        # A turn is a readiness poll, a back-off wait (at most 1.2 x the longest) or one
        # attempt: the node read and patched, each within the node timeout (retries inside).
        attempt = 4 * (api.SLOW_CONNECT_SECONDS + timeouts.settings.nodeTimeoutSeconds)
        self._loop = BackgroundLoop(
            "node-taint",
            self._run,
            heartbeat=1.2 * self.timing.max_backoff_seconds + attempt + 30.0,
        )
        self.attempts = 0
        """API rounds made (read + patch), for tests and debugging."""
        self.done = threading.Event()
        """Set once the taint is known to be gone (removed or absent) for the current readiness."""

    def start(self) -> None:
        self._loop.start()
        log.info(
            "will remove the node's not-ready taint once ready",
            extra={"fields": {"node": self.node_name, "taint": self.key}},
        )

    def stop(self) -> None:
        self._loop.stop()

    # -- loop -------------------------------------------------------------------------------

    def _run(self) -> None:
        poll = self.timing.ready_poll_seconds
        stop = self._loop.stopping
        while not stop.is_set():
            while not self._ready() and not stop.wait(poll):
                self._loop.beat()
            if stop.is_set():
                return
            if self._remove_until_done(stop):
                self.done.set()
            while self._ready() and not stop.wait(poll):
                self._loop.beat()
            self.done.clear()  # not ready any more: check again once ready again

    def _ready(self) -> bool:
        try:
            return bool(self._is_ready())
        except Exception:  # a broken check counts as not ready, as /readyz counts it
            log.exception("readiness check for the node taint raised")
            return False

    def _remove_until_done(self, stop: Stopping) -> bool:
        """Retry until the taint is gone (True) or `stop` is set (False)."""
        backoff = self.timing.initial_backoff_seconds
        changed_in_a_row = 0
        while not stop.is_set():
            self._loop.beat()
            self.attempts += 1
            try:
                effects = remove_taint(self._core, self.node_name, self.key, self._timeouts)
            except TaintChanged as e:
                changed_in_a_row += 1
                log.info(
                    "node taints changed while we removed ours; reading again",
                    extra={"fields": {"node": self.node_name, "taint": self.key, "error": str(e)}},
                )
                if changed_in_a_row <= self.timing.immediate_retries:
                    continue
                error = str(e)
            except Exception as e:  # an API error, connection refused, timeout: retry later
                error = _error(e)
            else:
                if effects:
                    log.info(
                        "removed the not-ready taint from the node",
                        extra={
                            "fields": {
                                "node": self.node_name,
                                "taint": self.key,
                                "effects": ",".join(effects),
                            }
                        },
                    )
                else:
                    log.info(
                        "the node has no not-ready taint; nothing to remove",
                        extra={"fields": {"node": self.node_name, "taint": self.key}},
                    )
                return True
            wait = backoff * random.uniform(0.8, 1.2)
            log.warning(
                "cannot remove the not-ready taint yet; retrying",
                extra={
                    "fields": {
                        "node": self.node_name,
                        "taint": self.key,
                        "error": error,
                        "retry_in_seconds": round(wait, 1),
                    }
                },
            )
            backoff = min(backoff * 2, self.timing.max_backoff_seconds)
            changed_in_a_row = 0
            if stop.wait(wait):
                return False
        return False


def _error(e: Exception) -> str:
    """An answer as `HTTP <status>: <the API's message>`, else the transport's own words."""
    if isinstance(e, KubeApiError) and e.answered:
        return f"HTTP {e.status}: {e.message}"
    cause = api.original(e)
    return f"{type(cause).__name__}: {str(cause)[:300]}"
