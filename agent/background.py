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
  its exception is reported;
- a loop given a `heartbeat` bound calls beat() on every turn, idle ones included: from start()
  until it stops or ends, a silence longer than the bound (the loop hung: blocked on a lock, a
  syscall, a call with no timeout) fails /healthz too, naming it (agent.liveness). `every`
  beats before each step, so its bound covers the interval and the step's longest run.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from agent.liveness import LIVENESS, Heart, Liveness

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
        heartbeat: float | None = None,
    ) -> None:
        """`body`'s return value is ignored; `join_timeout` None: stop() waits as long as the
        thread runs; `one_shot`: `body` may return on its own (a start-up task); `liveness`:
        where an unexpected end is reported; `heartbeat`: the longest silence between two
        beat() calls of a running loop (None: not judged)."""
        self.name = name
        self.stopping = threading.Event()
        """Set by stop(): the body's waits use it so that they end at once."""
        self._body = body
        self._wake = wake
        self._join_timeout = join_timeout
        self._one_shot = one_shot
        self._liveness = liveness
        self._heartbeat = heartbeat
        self._heart: Heart | None = None
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
        step_bound: float | None = None,
        liveness: Liveness = LIVENESS,
    ) -> BackgroundLoop:
        """A loop running `step` every `interval` seconds (also once at start with `at_start`);
        a step that raises is logged as `failed`, with its traceback, and the next still runs.
        `step_bound`: the longest a step may run (a step may beat more itself); with it the
        loop's heartbeat bound is `interval` + `step_bound`."""

        def guarded() -> None:
            try:
                step()
            except Exception:  # one bad round must not end the loop for the agent's lifetime
                log.exception(failed)

        def body() -> None:
            if at_start:
                guarded()
            while not loop.stopping.wait(interval):
                loop.beat()
                guarded()

        heartbeat = None if step_bound is None else interval + step_bound
        loop = cls(name, body, join_timeout=join_timeout, heartbeat=heartbeat, liveness=liveness)
        return loop

    def start(self) -> None:
        if self.running():
            raise RuntimeError(f"background loop {self.name} is already running")
        self.stopping.clear()
        if self._heartbeat is not None:
            self._heart = self._liveness.heart(self.name, self._heartbeat)
        heart = self._heart
        self._thread = threading.Thread(
            target=self._main, args=(heart,), name=self.name, daemon=True
        )
        self._thread.start()

    def stop(self) -> bool:
        """Stop and wait for the thread (at most `join_timeout`); True when it has ended."""
        self.stopping.set()
        self._quiet()
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

    def beat(self) -> None:
        """The loop took a turn (its heartbeat, when it has one)."""
        heart = self._heart
        if heart is not None:
            heart.beat()

    def _quiet(self) -> None:
        heart, self._heart = self._heart, None
        if heart is not None:
            heart.quiet()

    def running(self) -> bool:
        """True while the thread runs (also while it is stopping)."""
        return self._thread is not None and self._thread.is_alive()

    def _main(self, heart: Heart | None) -> None:
        try:
            self._body()
        except BaseException as e:  # logged with the loop's name, not threading's bare print
            log.exception(
                "background loop failed and has ended", extra={"fields": {"loop": self.name}}
            )
            if not self.stopping.is_set():
                self._liveness.ended(self.name, f"raised {type(e).__name__}: {str(e)[:200]}")
            return
        else:
            if not self._one_shot and not self.stopping.is_set():
                self._liveness.ended(self.name, "returned without being stopped")
        finally:  # ended: judged by `ended`, no longer by its heartbeat
            if heart is not None:
                heart.quiet()
