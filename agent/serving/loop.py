"""One listener served by one thread: non-blocking sockets under a selector, so a peer that
connects and says nothing, or says it slowly, costs a descriptor and a few hundred bytes until a
timeout or the cap closes it, never a thread.

Each connection is in one state: IDLE (waiting for a request's first byte, `idle_timeout`),
READING (a request begun, complete within `request_timeout`), BUSY (the app answers it; nothing is
read meanwhile), WRITING (the reply, taken by the peer within `write_timeout`) or LINGER (sent a
final reply; what the peer still sends is read and dropped for a moment, so a TCP reset cannot
destroy the reply in flight). Over `max_connections` the connection that has waited longest
(since it was accepted or last answered) and is not BUSY is closed; only when all are BUSY is the
newcomer refused. Connections are accepted after the ready ones are read, in batches well below
the cap, so a newcomer's request is read before a flood of later connections could push it out.

The app runs on the loop's thread (`workers=0`: quick answers such as /healthz) or in a bounded
pool of worker threads whose replies the loop writes.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import logging
import selectors
import socket
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

from agent.background import JOIN_TIMEOUT_SECONDS, BackgroundLoop
from agent.serving.http import CONTINUE, FramingError, Head, Request, Response, parse_head
from agent.serving.limits import Limits

log = logging.getLogger(__name__)

TICK = 0.1
"""Timeouts are checked this often."""
ACCEPT_BATCH = 32
RECV_BYTES = 64 << 10
LINGER_SECONDS = 1.0
STOP_GRACE = 30.0
"""On stop, replies being worked on get this long to be sent."""
REPORT_INTERVAL = 10.0
"""Closed and refused connections are logged as counts at most this often."""
_RESOURCE_ERRORS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


class App(Protocol):
    def handle(self, request: Request) -> Response:
        """The reply to a complete request (may raise: answered as a 500)."""
        ...

    def refuse(self, status: int, message: str) -> Response:
        """The reply to a request that could not be read (framing errors, internal errors)."""
        ...


PeerCheck = Callable[[socket.socket], "str | None"]
"""None when the connected peer may be served, else why not."""


class _State(enum.Enum):
    IDLE = "idle"
    READING = "reading"
    BUSY = "busy"
    WRITING = "writing"
    LINGER = "linger"


class _Conn:
    __slots__ = (
        "body_at",
        "buf",
        "closed",
        "deadline",
        "events",
        "fd",
        "head",
        "head_only",
        "keep_alive",
        "out",
        "sent",
        "sock",
        "state",
    )

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.buf = bytearray()
        self.out = b""
        self.sent = 0
        self.events = 0
        self.state = _State.IDLE
        self.deadline = deadline
        self.head: Head | None = None
        self.body_at = 0
        self.head_only = False
        self.keep_alive = True
        self.closed = False


class _Listener:
    """Marks the listener's selector key."""


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
        check_peer: PeerCheck | None = None,
    ) -> None:
        self.name = name
        self._listener = listener
        self._app = app
        self._limits = limits
        self._workers = workers
        self._check_peer = check_peer
        self._conns: OrderedDict[int, _Conn] = OrderedDict()
        """Oldest wait first: the order connections are closed in when over the cap."""
        self._done: deque[tuple[_Conn, Future[Response]]] = deque()
        # The loop bounds its own stop (STOP_GRACE): the join's limit only catches a bug.
        self._loop = BackgroundLoop(
            name, self._run, wake=self._wake, join_timeout=STOP_GRACE + JOIN_TIMEOUT_SECONDS
        )
        self._stopping = self._loop.stopping
        self._pool: ThreadPoolExecutor | None = None
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._accept_paused_until = 0.0
        self._next_sweep = 0.0
        self._counts: dict[str, int] = {}
        self._next_report = 0.0

    # --- lifecycle (any thread)

    def start(self) -> None:
        self._listener.setblocking(False)
        for sock in (self._wake_r, self._wake_w):
            sock.setblocking(False)
        self._sel.register(self._listener, selectors.EVENT_READ, _Listener)
        self._sel.register(self._wake_r, selectors.EVENT_READ, _Wake)
        if self._workers:
            self._pool = ThreadPoolExecutor(self._workers, thread_name_prefix=f"{self.name}-work")
        self._loop.start()

    def stop(self) -> None:
        """Stop accepting, close idle connections, send the replies being worked on (at most
        STOP_GRACE), then return with every thread of the server ended."""
        self._loop.stop()

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
                    stop_by = now + STOP_GRACE
                    self._begin_stop()
                if stop_by is not None and (not self._conns or now >= stop_by):
                    return
                self._step(now)
        except Exception:  # a bug: logged, and the server ends rather than spinning
            log.exception("%s: serving loop failed", self.name)
        finally:
            self._end()

    def _step(self, now: float) -> None:
        accept = False
        for key, mask in self._sel.select(TICK):
            if key.data is _Listener:
                accept = True
            elif key.data is _Wake:
                with contextlib.suppress(OSError):
                    self._wake_r.recv(4096)
            else:
                conn: _Conn = key.data
                now = time.monotonic()
                if mask & selectors.EVENT_READ and not conn.closed:
                    self._readable(conn, now)
                if mask & selectors.EVENT_WRITE and not conn.closed:
                    self._write(conn, now)
        now = time.monotonic()
        while self._done:
            conn, future = self._done.popleft()
            self._respond(conn, future.result(), now)
        if accept and not self._stopping.is_set():
            self._accept(now)
        if now >= self._next_sweep:
            self._sweep(now)

    def _begin_stop(self) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(self._listener)
        self._listener.close()
        for conn in list(self._conns.values()):
            if conn.state in (_State.IDLE, _State.READING, _State.LINGER):
                self._close(conn)

    def _end(self) -> None:
        for conn in list(self._conns.values()):
            self._close(conn)
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        with contextlib.suppress(OSError):
            self._listener.close()
        self._sel.close()
        self._wake_r.close()
        self._wake_w.close()

    # --- accepting

    def _accept(self, now: float) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                sock, _ = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as e:
                if e.errno in _RESOURCE_ERRORS:  # wait for descriptors to free, do not spin
                    self._count(f"accept failed ({errno.errorcode.get(e.errno or 0, e)})")
                    self._sel.unregister(self._listener)
                    self._accept_paused_until = now + TICK
                    return
                continue  # the peer gave up before we accepted (ECONNABORTED)
            self._admit(sock, now)

    def _admit(self, sock: socket.socket, now: float) -> None:
        sock.setblocking(False)
        if self._check_peer is not None:
            reason = self._check_peer(sock)
            if reason is not None:
                self._count(f"refused: {reason}")
                sock.close()
                return
        if len(self._conns) >= self._limits.max_connections and not self._evict():
            self._count("refused: every connection is being answered")
            sock.close()
            return
        conn = _Conn(sock, now + self._limits.idle_timeout)
        self._conns[conn.fd] = conn
        self._watch(conn, selectors.EVENT_READ)

    def _evict(self) -> bool:
        for conn in self._conns.values():
            if conn.state is not _State.BUSY:
                self._count(f"closed over the cap of {self._limits.max_connections}")
                self._close(conn)
                return True
        return False

    # --- reading

    def _readable(self, conn: _Conn, now: float) -> None:
        try:
            data = conn.sock.recv(RECV_BYTES)
        except BlockingIOError:
            return
        except OSError:
            self._close(conn)
            return
        if not data:
            self._close(conn)
            return
        if conn.state is _State.LINGER:
            return  # dropped: the connection is closing
        if conn.state is _State.IDLE:
            conn.state = _State.READING
            conn.deadline = now + self._limits.request_timeout
        conn.buf += data
        self._advance(conn, now)

    def _advance(self, conn: _Conn, now: float) -> None:
        """Dispatch the request at the start of the buffer once it is complete."""
        limits = self._limits
        if conn.head is None:
            try:
                parsed = parse_head(
                    conn.buf, max_head=limits.max_head_bytes, max_body=limits.max_body_bytes
                )
            except FramingError as e:
                self._count(f"bad request ({e.status})")
                conn.keep_alive = False
                self._respond(conn, self._app.refuse(e.status, e.message), now)
                return
            if parsed is None:
                return
            conn.head, conn.body_at = parsed
            head = parsed[0]
            if head.expects_continue and len(conn.buf) < conn.body_at + head.content_length:
                with contextlib.suppress(OSError):  # best effort: curl sends on after 1 s anyway
                    conn.sock.send(CONTINUE, socket.MSG_NOSIGNAL)
        head = conn.head
        end = conn.body_at + head.content_length
        if len(conn.buf) < end:
            return
        request = Request(head, bytes(conn.buf[conn.body_at : end]))
        del conn.buf[:end]
        conn.head = None
        conn.keep_alive = request.head.keep_alive
        conn.head_only = request.method == "HEAD"
        self._dispatch(conn, request, now)

    # --- answering

    def _dispatch(self, conn: _Conn, request: Request, now: float) -> None:
        conn.state = _State.BUSY
        self._watch(conn, 0)
        if self._pool is None:
            self._respond(conn, self._answer(request), now)
            return
        future = self._pool.submit(self._answer, request)
        future.add_done_callback(lambda f: self._completed(conn, f))

    def _completed(self, conn: _Conn, future: Future[Response]) -> None:
        """A worker's reply (worker thread): handed to the loop."""
        self._done.append((conn, future))
        self._wake()

    def _answer(self, request: Request) -> Response:
        try:
            return self._app.handle(request)
        except Exception:
            log.exception("%s: %s %s failed", self.name, request.method, request.path)
            return self._app.refuse(500, "internal error")

    def _respond(self, conn: _Conn, response: Response, now: float) -> None:
        if conn.closed:
            return
        keep = conn.keep_alive and not response.close and not self._stopping.is_set()
        conn.keep_alive = keep
        conn.out = response.encode(keep_alive=keep, head_only=conn.head_only)
        conn.sent = 0
        conn.state = _State.WRITING
        conn.deadline = now + self._limits.write_timeout
        self._write(conn, now)

    def _write(self, conn: _Conn, now: float) -> None:
        if conn.state is not _State.WRITING:
            return
        view = memoryview(conn.out)
        while conn.sent < len(view):
            try:
                conn.sent += conn.sock.send(view[conn.sent :], socket.MSG_NOSIGNAL)
            except BlockingIOError:
                self._watch(conn, selectors.EVENT_WRITE)
                return
            except OSError:
                self._close(conn)
                return
        conn.out = b""
        if not conn.keep_alive:
            if self._stopping.is_set() or conn.sock.family == socket.AF_UNIX:
                self._close(conn)  # no TCP reset to fear, or no time to wait for one
            else:
                self._linger(conn, now)
            return
        conn.state = _State.IDLE
        conn.deadline = now + self._limits.idle_timeout
        self._conns.move_to_end(conn.fd)  # its wait starts now
        self._watch(conn, selectors.EVENT_READ)
        if conn.buf:  # the next request came with the last one
            conn.state = _State.READING
            conn.deadline = now + self._limits.request_timeout
            self._advance(conn, now)

    def _linger(self, conn: _Conn, now: float) -> None:
        try:
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._close(conn)
            return
        conn.state = _State.LINGER
        conn.buf = bytearray()
        conn.deadline = now + LINGER_SECONDS
        self._watch(conn, selectors.EVENT_READ)

    # --- timeouts, closing, bookkeeping

    def _sweep(self, now: float) -> None:
        self._next_sweep = now + TICK
        if self._accept_paused_until and now >= self._accept_paused_until:
            self._accept_paused_until = 0.0
            if not self._stopping.is_set():
                self._sel.register(self._listener, selectors.EVENT_READ, _Listener)
        for conn in list(self._conns.values()):
            if conn.state is not _State.BUSY and now >= conn.deadline:
                if conn.state in (_State.READING, _State.WRITING):
                    self._count(f"timed out {conn.state.value}")
                self._close(conn)
        if now >= self._next_report:
            self._next_report = now + REPORT_INTERVAL
            if self._counts:
                log.warning(
                    "%s: connections closed or refused",
                    self.name,
                    extra={"fields": {**self._counts, "open": len(self._conns)}},
                )
                self._counts = {}

    def _count(self, what: str) -> None:
        self._counts[what] = self._counts.get(what, 0) + 1

    def _watch(self, conn: _Conn, events: int) -> None:
        if events == conn.events:
            return
        if conn.events == 0:
            self._sel.register(conn.sock, events, conn)
        elif events == 0:
            self._sel.unregister(conn.sock)
        else:
            self._sel.modify(conn.sock, events, conn)
        conn.events = events

    def _close(self, conn: _Conn) -> None:
        if conn.closed:
            return
        conn.closed = True
        self._watch(conn, 0)
        self._conns.pop(conn.fd, None)
        conn.sock.close()
