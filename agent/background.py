"""One background loop: a named daemon thread that runs until it is stopped.

Every long-lived thread of the agent (the install watcher, readiness, repair, the node taint
remover, the caches, ambient's start-up and watch, the ZDS accept loop, the serving loops, the
plugin log forwarding) is one of these, so each starts, stops and fails the same way:

- start() runs `body` on a new daemon thread; starting one that still runs is a bug and raises
  (two threads would share one `stopping`);
- stop() sets `stopping`, calls `wake` (for a blocking wait the event cannot reach: a condition,
  an open watch response, a selector) and waits at most `join_timeout` seconds: a thread still
  stuck after that is logged and left behind (a daemon thread, so the process can still exit),
  so one hung loop cannot keep the agent from stopping and uninstalling within its grace period;
- an exception that escapes `body` is logged with its traceback and the loop's name, and ends
  the loop (a loop that must outlive a failed round catches per round: `every` does);
- a loop that ends without being stopped (`body` raised, or returned while `stopping` was not
  set) is reported to agent.liveness: /healthz fails from then on, naming it, so kubelet
  restarts the agent. A start-up task whose body returns once done says so (`one_shot`): only
  its exception is reported.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from agent.liveness import LIVENESS, Liveness

log = logging.getLogger(__name__)

JOIN_TIMEOUT_SECONDS = 10.0
"""How long stop() waits for a loop's thread: a round of any loop here ends well within it."""


class BackgroundLoop:
    """start() runs `body` on a thread named `name`; `body` returns once `stopping` is set."""

    def __init__(
        self,
        name: str,
        body: Callable[[], object],
        *,
        wake: Callable[[], None] | None = None,
        join_timeout: float | None = JOIN_TIMEOUT_SECONDS,
        one_shot: bool = False,
        liveness: Liveness = LIVENESS,
    ) -> None:
        """`body`'s return value is ignored; `join_timeout` None: stop() waits as long as the
        thread runs; `one_shot`: `body` may return on its own (a start-up task); `liveness`:
        where an unexpected end is reported."""
        self.name = name
        self.stopping = threading.Event()
        """Set by stop(): the body's waits use it so that they end at once."""
        self._body = body
        self._wake = wake
        self._join_timeout = join_timeout
        self._one_shot = one_shot
        self._liveness = liveness
        self._thread: threading.Thread | None = None

    @classmethod
    def every(
        cls,
        name: str,
        interval: float,
        step: Callable[[], object],
        *,
        failed: str,
        at_start: bool = False,
        join_timeout: float | None = JOIN_TIMEOUT_SECONDS,
    ) -> BackgroundLoop:
        """A loop running `step` every `interval` seconds (also once at start with `at_start`);
        a step that raises is logged as `failed`, with its traceback, and the next still runs."""

        def guarded() -> None:
            try:
                step()
            except Exception:  # one bad round must not end the loop for the agent's lifetime
                log.exception(failed)

        def body() -> None:
            if at_start:
                guarded()
            while not loop.stopping.wait(interval):
                guarded()

        loop = cls(name, body, join_timeout=join_timeout)
        return loop

    def start(self) -> None:
        if self.running():
            raise RuntimeError(f"background loop {self.name} is already running")
        self.stopping.clear()
        self._thread = threading.Thread(target=self._main, name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> bool:
        """Stop and wait for the thread (at most `join_timeout`); True when it has ended."""
        self.stopping.set()
        if self._wake is not None:
            self._wake()
        thread, self._thread = self._thread, None
        if thread is None or thread is threading.current_thread():
            return thread is None
        thread.join(self._join_timeout)
        if thread.is_alive():
            log.warning(
                "background loop did not stop in time; left running",
                extra={"fields": {"loop": self.name, "waitedSeconds": self._join_timeout}},
            )
            self._thread = thread  # still ours: a start() now would be refused
            return False
        return True

    def running(self) -> bool:
        """True while the thread runs (also while it is stopping)."""
        return self._thread is not None and self._thread.is_alive()

    def _main(self) -> None:
        try:
            self._body()
        except BaseException as e:  # logged with the loop's name, not threading's bare print
            log.exception(
                "background loop failed and has ended", extra={"fields": {"loop": self.name}}
            )
            if not self.stopping.is_set():
                self._liveness.ended(self.name, f"raised {type(e).__name__}: {str(e)[:200]}")
            return
        if not self._one_shot and not self.stopping.is_set():
            self._liveness.ended(self.name, "returned without being stopped")
