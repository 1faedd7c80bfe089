"""One listener served by one thread: non-blocking sockets under a selector, so a peer that
connects and says nothing, or says it slowly, costs a descriptor and a few hundred bytes until a
timeout or the cap closes it, never a thread.

The connections, their states, the cap and the timeouts are agent.serving.connections'; who is let
in (accepted in batches after the ready ones are read, checked, charged to a budget) is
agent.serving.admission's.

The bytes are read by h11 (agent.serving.http.Exchange); the loop only moves them. Pipelined
requests wait in the exchange: once a reply is sent its connection joins the `ready` queue,
whose next request is taken on the loop's next round, one per connection per round, so a batch
of requests in one write is a queue, never a call chain, and cannot starve the others. Only a
connection whose exchange needs more bytes is read from: what a peer sends ahead is bounded.

Whatever one connection's step raises (the app, the framing, a socket call) ends that connection,
answered 500 when its reply had not begun, never the loop; only a broken worker pool or the
selector itself ends the loop, and its BackgroundLoop reports that to agent.liveness; each round
beats its heartbeat, so a loop blocked in one (a handler that never returns) fails liveness too.

The app runs on the loop's thread (`workers=0`: quick answers such as /healthz) or in a bounded
pool of worker threads whose replies the loop writes (all requests, or those `offload` picks).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import selectors
import socket
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Protocol

from agent.background import JOIN_TIMEOUT_SECONDS, BackgroundLoop
from agent.liveness import LIVENESS, Liveness, Pool
from agent.serving.admission import Admission, PeerCheck
from agent.serving.budget import Budget
from agent.serving.connections import REPORT_INTERVAL, Conn, Connections, State
from agent.serving.http import FramingError, Request, Response
from agent.serving.limits import Limits
from agent.serving.listener import Listener
from agent.serving.workers import Workers

log = logging.getLogger(__name__)

TICK = 0.1
"""Timeouts are checked this often."""
RECV_BYTES = 64 << 10
LINGER_SECONDS = 1.0
HEARTBEAT_SECONDS = 60.0
"""The loop's heartbeat bound (agent.liveness): a round waits TICK at most and answers on the
loop's thread only what is quick (probes, the status report); hundreds of times its length."""
STOP_GRACE = 30.0
"""On stop, replies being worked on get this long to be sent."""


class App(Protocol):
    def handle(self, request: Request) -> Response:
        """The reply to a complete request (may raise: answered as a 500)."""
        ...

    def refuse(self, status: int, message: str) -> Response:
        """The reply to a request that could not be read (framing errors, internal errors)."""
        ...


Offload = Callable[[Request], bool]
"""With workers: True for a request the pool answers, False for one the loop's thread does."""


class _LoopBroken(Exception):
    """What the loop as a whole cannot go on without (the worker pool) is gone: it ends."""


class _Wake:
    """Marks the wake-up socket's selector key."""


class Server:
    """Serves `app` on `listener` (bound and listening; owned from now on) within `limits`."""

    def __init__(
        self,
        listener: socket.socket,
        app: App,
        limits: Limits,
        *,
        name: str,
        workers: int = 0,
        offload: Offload | None = None,
        check_peer: PeerCheck | None = None,
        liveness: Liveness = LIVENESS,
        heartbeat: float = HEARTBEAT_SECONDS,
        work_bound: float | None = None,
        budget: Budget | None = None,
        stop_grace: float = STOP_GRACE,
        join_timeout: float = JOIN_TIMEOUT_SECONDS,
    ) -> None:
        """`liveness`: where the loop's end is reported should it end without being stopped,
        and its heartbeat judged (`heartbeat`: the longest silence between two rounds), and its
        workers' items (`work_bound`: the longest one may run; None: not judged); `budget`:
        the requests a second its TCP peers are answered (agent.serving.budget)."""
        self.name = name
        self._sel = selectors.DefaultSelector()
        self._listener = Listener(listener, self._sel)
        self._app = app
        self._limits = limits
        self._offload = offload
        self._budget = budget
        self._conns = Connections(self._sel, limits, name=name)
        self._admission = Admission(
            self._listener, self._conns, name=name, check_peer=check_peer, budget=budget, pause=TICK
        )
        self._ready: deque[Conn] = deque()
        """Replied to and kept open: their next request may be buffered already."""
        self._done: deque[tuple[Conn, Future[Response]]] = deque()
        self._stop_grace = stop_grace
        # stop() waits `stop_grace` for replies in work, then `join_timeout` for the workers.
        self._loop = BackgroundLoop(
            name,
            self._run,
            wake=self._wake,
            join_timeout=stop_grace + 2 * join_timeout,
            liveness=liveness,
            heartbeat=heartbeat,
        )
        self._stopping = self._loop.stopping
        self._pool = Workers(workers, f"{name}-work", join_timeout) if workers else None
        self._work: Pool | None = None  # idle, a pool is never judged hung: judged from now
        if workers and work_bound is not None:
            self._work = liveness.pool(f"{name}-workers", work_bound)
        self._wake_r, self._wake_w = socket.socketpair()
        self._next_sweep = 0.0
        self._next_trace = 0.0

    # --- lifecycle (any thread)

    def start(self) -> None:
        for sock in (self._wake_r, self._wake_w):
            sock.setblocking(False)
        self._listener.register()
        self._sel.register(self._wake_r, selectors.EVENT_READ, _Wake)
        self._loop.start()

    def stop(self) -> None:
        """Stop accepting; replies in work get `stop_grace`, workers `join_timeout`, then left."""
        if self._work is not None:  # stopping: judged no more, as the loop's own heartbeat
            self._work.quiet()
        self._loop.stop()

    def replace_listener(self, listener: socket.socket) -> None:
        """Accept on `listener` (bound, listening, owned from now on) from the loop's next
        round; the current one is closed then, the connections open stay served."""
        self._listener.offer(listener)
        self._wake()

    @property
    def connections(self) -> int:
        return len(self._conns)

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # full: a wake-up is pending anyway
            self._wake_w.send(b"\0")

    # --- the loop (its own thread)

    def _run(self) -> None:
        stop_by: float | None = None
        try:
            while True:
                now = time.monotonic()
                if self._stopping.is_set() and stop_by is None:
                    stop_by = now + self._stop_grace
                    self._begin_stop()
                if stop_by is not None and (not self._conns or now >= stop_by):
                    return
                self._loop.beat()
                self._step()
        finally:  # a bug that ends the loop: BackgroundLoop logs it and reports it to liveness
            self._end()

    def _step(self) -> None:
        if self._listener.offered:
            self._listener.swap_if_offered()
        accept = False
        for key, mask in self._sel.select(self._admission.wait(0 if self._ready else TICK)):
            if key.data is self._listener:
                accept = True
            elif key.data is _Wake:
                with contextlib.suppress(OSError):
                    self._wake_r.recv(4096)
            else:
                conn: Conn = key.data
                self._guarded(conn, functools.partial(self._on_event, conn, mask))
        while self._done:
            conn, future = self._done.popleft()
            self._guarded(conn, functools.partial(self._on_reply, conn, future))
        for _ in range(len(self._ready)):  # those queued now; requeued ones go next round
            conn = self._ready.popleft()
            self._guarded(conn, functools.partial(self._advance, conn, time.monotonic()))
        now = time.monotonic()
        if accept and not self._stopping.is_set():
            self._admission.accept(now)
        self._admission.settle()
        if now >= self._next_sweep:
            self._sweep(now)

    def _guarded(self, conn: Conn, step: Callable[[], None]) -> None:
        """One step of one connection: whatever it raises ends that connection, not the loop."""
        try:
            step()
        except _LoopBroken:
            raise
        except Exception:
            self._internal_error(conn)

    def _internal_error(self, conn: Conn) -> None:
        now = time.monotonic()
        self._conns.count("closed on an internal error")
        if now >= self._next_trace:  # the traceback, not one per connection a peer can cause
            self._next_trace = now + REPORT_INTERVAL
            log.exception("%s: a connection failed; closed", self.name)
        if not conn.closed and conn.state in (State.READING, State.BUSY):
            with contextlib.suppress(Exception):  # the 500 is best effort: the close is not
                self._send_final(conn, self._app.refuse(500, "internal error"), now)
                return
        self._conns.close(conn)

    def _begin_stop(self) -> None:
        self._listener.close()
        self._admission.close()
        for conn in self._conns:
            if conn.state in (State.IDLE, State.READING, State.LINGER):
                self._conns.close(conn)

    def _end(self) -> None:
        self._admission.close()
        for conn in self._conns:
            self._conns.close(conn)
        if self._pool is not None:
            self._pool.shutdown()  # names the workers it left behind
        self._listener.close()
        self._sel.close()
        self._wake_r.close()
        self._wake_w.close()

    # --- reading

    def _on_event(self, conn: Conn, mask: int) -> None:
        now = time.monotonic()
        if mask & selectors.EVENT_READ and not conn.closed:
            self._readable(conn, now)
        if mask & selectors.EVENT_WRITE and not conn.closed:
            self._flush(conn, now)

    def _readable(self, conn: Conn, now: float) -> None:
        try:
            data = conn.sock.recv(RECV_BYTES)
        except BlockingIOError:
            return
        except OSError:
            self._conns.close(conn)
            return
        if not data:
            self._conns.close(conn)
            return
        if conn.state is State.LINGER:
            return  # dropped: the connection is closing
        if conn.state is State.IDLE:
            conn.state = State.READING
            conn.deadline = now + self._limits.request_timeout
        conn.exchange.feed(data, time.monotonic())  # taken after the read: all had arrived
        self._advance(conn, now)

    def _advance(self, conn: Conn, now: float) -> None:
        """Dispatch the next complete request, or wait for the bytes it still needs."""
        if conn.closed or conn.state not in (State.IDLE, State.READING):
            return
        try:
            request = conn.exchange.next_request()
        except FramingError as e:
            self._conns.count(f"bad request ({e.status})")
            self._send_final(conn, self._app.refuse(e.status, e.message), now)
            return
        if request is not None:
            self._dispatch(conn, request, now)
            return
        if conn.exchange.reading():
            if conn.state is State.IDLE:  # the next request began with the last one
                conn.state = State.READING
                conn.deadline = now + self._limits.request_timeout
            if not self._send_continue(conn):
                return
        self._conns.watch(conn, selectors.EVENT_READ)

    def _send_continue(self, conn: Conn) -> bool:
        """`100 Continue` where the request waits for it; False when the connection is closed:
        the socket did not take 25 bytes, so the peer is gone or never reads."""
        go_on = conn.exchange.continue_reply()
        try:
            if not go_on or conn.sock.send(go_on, socket.MSG_NOSIGNAL) == len(go_on):
                return True
        except OSError:
            pass
        self._conns.close(conn)
        return False

    # --- answering

    def _dispatch(self, conn: Conn, request: Request, now: float) -> None:
        if self._budget is not None and not self._budget.request(conn.peer, request.path):
            self._conns.count("answered 429: over its request budget")
            self._send_final(conn, self._app.refuse(429, "too many requests"), now)
            return  # and closed: what it pipelined behind is never read
        conn.state = State.BUSY
        self._conns.watch(conn, 0)
        if self._pool is None or (self._offload is not None and not self._offload(request)):
            self._reply(conn, self._answer(request), now)
            return
        try:
            if self._work is None:
                future = self._pool.submit(self._answer, request)
            else:  # each item's start and end noted for liveness
                future = self._pool.submit(self._work.timed, self._answer, request)
        except RuntimeError as e:  # shut down under us: no request can be answered any more
            raise _LoopBroken(f"{self.name}: the worker pool is gone: {e}") from e
        future.add_done_callback(lambda f: self._completed(conn, f))

    def _completed(self, conn: Conn, future: Future[Response]) -> None:
        """A worker's reply (worker thread): handed to the loop."""
        self._done.append((conn, future))
        self._wake()

    def _answer(self, request: Request) -> Response:
        try:
            return self._app.handle(request)
        except Exception:
            log.exception("%s: %s %s failed", self.name, request.method, request.path)
            return self._app.refuse(500, "internal error")

    def _on_reply(self, conn: Conn, future: Future[Response]) -> None:
        if not conn.closed and conn.state is State.BUSY:  # else ended while the worker worked
            self._reply(conn, future.result(), time.monotonic())

    def _reply(self, conn: Conn, response: Response, now: float) -> None:
        close = response.close or self._stopping.is_set()
        self._start_write(conn, conn.exchange.reply(response, close=close), close, now)

    def _send_final(self, conn: Conn, response: Response, now: float) -> None:
        """A reply after which the connection ends, whatever its exchange's state."""
        self._start_write(conn, response.encode(keep_alive=False), True, now)

    def _start_write(self, conn: Conn, out: bytes, close: bool, now: float) -> None:
        conn.out, conn.sent, conn.close_after = out, 0, close
        conn.state = State.WRITING
        conn.deadline = now + self._limits.write_timeout
        self._flush(conn, now)

    def _flush(self, conn: Conn, now: float) -> None:
        """Send what the socket takes; once all is sent, close or queue the connection for its
        next request (never read it here: that is the next round's)."""
        if conn.state is not State.WRITING:
            return
        view = memoryview(conn.out)
        while conn.sent < len(view):
            try:
                conn.sent += conn.sock.send(view[conn.sent :], socket.MSG_NOSIGNAL)
            except BlockingIOError:
                self._conns.watch(conn, selectors.EVENT_WRITE)
                return
            except OSError:
                self._conns.close(conn)
                return
        conn.out = b""
        if conn.close_after or self._stopping.is_set() or not conn.exchange.next_cycle():
            if self._stopping.is_set() or conn.sock.family == socket.AF_UNIX:
                self._conns.close(conn)  # no TCP reset to fear, or no time to wait for one
            else:
                self._linger(conn, now)
            return
        self._conns.waits_from(conn, State.IDLE, now + self._limits.idle_timeout)
        self._conns.watch(conn, 0)
        self._ready.append(conn)

    def _linger(self, conn: Conn, now: float) -> None:
        try:
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._conns.close(conn)
            return
        conn.state = State.LINGER
        conn.deadline = now + LINGER_SECONDS
        self._conns.watch(conn, selectors.EVENT_READ)

    # --- timeouts

    def _sweep(self, now: float) -> None:
        self._next_sweep = now + TICK
        if not self._stopping.is_set():
            self._listener.resume_if_due(now)
        self._conns.sweep(now)
