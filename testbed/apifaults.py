"""A fault-injecting path to the real kube-apiserver, of our own: a TLS-terminating HTTP/1.1
proxy between in-cluster clients (the agents, through the node's `kubernetes` Service) and the
API server, that forwards every request as it came (the client's own bearer token included) and,
while a fault is set, answers as a failing API server would instead.

Faults (`Fault`, set with `ApiFaultProxy.set_fault`, cleared with `clear`):
- `latency`: each request held `seconds` before it is forwarded;
- `reset`: connections, open ones included, reset (RST) as a dead peer or a middlebox would;
- `silence`: requests read and never answered, streams stopped mid-way (a hung API server or a
  black-holed route: only the client's own timeouts end them);
- `status`: every request answered `code` (429, 401, 503, ...) with a Status body and, when given,
  `Retry-After`;
- `gone_on_resume`: a watch that resumes from a resourceVersion answered 410 Gone, as when the
  version left the watch cache (the client must list again).
Streams open when a fault is set end as it says (reset, held silent, or closed as by a server
restart for `status` and `gone_on_resume`, so that the client's resume meets the fault); under
`latency` they go on.
The proxy counts the requests it saw (`requests`), so a test can bound a client's rate during a
fault. TLS: a serving certificate from the cluster's CA for the Service's IP, so the client's
CA check passes as against the real server; upstream TLS is checked against the same CA.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import h11

from testbed import pki

READ_SIZE = 65536
POLL_SECONDS = 0.2
"""How often a held request or a stream looks at the fault again."""


@dataclass(frozen=True)
class Fault:
    kind: str  # latency | reset | silence | status | gone_on_resume
    seconds: float = 0.0
    code: int = 0
    retry_after: int | None = None


@dataclass(frozen=True)
class SeenRequest:
    at: float
    method: str
    target: str
    fault: str


@dataclass
class _Switch:
    fault: Fault | None = None
    generation: int = 0
    changed: threading.Condition = field(default_factory=threading.Condition)


class ApiFaultProxy:
    """Listens on `address` (an ephemeral port), forwards to `upstream` (host, port). Use as a
    context manager, or start() then stop()."""

    def __init__(
        self,
        workdir: Path,
        ca: pki.KeyPair,
        upstream: tuple[str, int],
        address: str,
        server_ips: tuple[str, ...],
    ) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        serving = pki.issue(
            ca,
            workdir,
            "apifaults",
            common_name="kube-apiserver",
            server_names=["kubernetes", "kubernetes.default", "kubernetes.default.svc"],
            server_ips=sorted({address, *server_ips}),
        )
        self._server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._server_tls.load_cert_chain(str(serving.cert), str(serving.key))
        self._upstream_tls = ssl.create_default_context(cafile=str(ca.cert))
        self._upstream_tls.check_hostname = False  # the CA is checked; the address is ours
        self.upstream = upstream
        self._listener = socket.create_server((address, 0))
        self.address, self.port = self._listener.getsockname()[:2]
        self._switch = _Switch()
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._stopped = threading.Event()
        self.requests: list[SeenRequest] = []
        self._thread = threading.Thread(target=self._accept, name="apifaults", daemon=True)

    # -- control -------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self.clear()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            for sock in list(self._open):
                _reset(sock)
        self._thread.join(timeout=5)

    def __enter__(self) -> ApiFaultProxy:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def set_fault(self, fault: Fault) -> None:
        with self._switch.changed:
            self._switch.fault = fault
            self._switch.generation += 1
            self._switch.changed.notify_all()
        if fault.kind == "reset":
            with self._lock:
                for sock in list(self._open):
                    _reset(sock)

    def clear(self) -> None:
        with self._switch.changed:
            self._switch.fault = None
            self._switch.generation += 1
            self._switch.changed.notify_all()

    @contextlib.contextmanager
    def faulted(self, fault: Fault) -> Iterator[None]:
        self.set_fault(fault)
        try:
            yield
        finally:
            self.clear()

    @property
    def fault(self) -> Fault | None:
        return self._switch.fault

    def seen_between(self, start: float, end: float) -> list[SeenRequest]:
        with self._lock:
            return [r for r in self.requests if start <= r.at < end]

    # -- serving -------------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                raw, _ = self._listener.accept()
            except OSError:
                return
            if self._switch.fault is not None and self._switch.fault.kind == "reset":
                _reset(raw)
                continue
            threading.Thread(target=self._serve, args=(raw,), daemon=True).start()

    def _track(self, sock: socket.socket, add: bool) -> None:
        with self._lock:
            (self._open.add if add else self._open.discard)(sock)

    def _serve(self, raw: socket.socket) -> None:
        self._track(raw, True)
        upstream: _Upstream | None = None
        client: socket.socket = raw
        try:
            raw.settimeout(30)
            client = self._server_tls.wrap_socket(raw, server_side=True)  # takes raw's descriptor
            self._track(raw, False)
            self._track(client, True)
            client.settimeout(
                None
            )  # a watch may be quiet for minutes: the client's timeouts end it
            peer = h11.Connection(h11.SERVER)
            while not self._stopped.is_set():
                request, body = _read_request(peer, client)
                if request is None:
                    return
                target = request.target.decode("latin-1")
                fault = self._switch.fault
                with self._lock:
                    self.requests.append(
                        SeenRequest(
                            time.monotonic(),
                            request.method.decode(),
                            target,
                            fault.kind if fault else "",
                        )
                    )
                if not self._answer_faulted(peer, client, target, fault):
                    if upstream is None:
                        upstream = _Upstream(self.upstream, self._upstream_tls)
                    if not self._forward(peer, client, upstream, request, body):
                        return
                if peer.our_state is h11.MUST_CLOSE or peer.their_state is h11.MUST_CLOSE:
                    return
                peer.start_next_cycle()
        except (OSError, h11.ProtocolError, ssl.SSLError):
            return
        finally:
            if upstream is not None:
                upstream.close()
            self._track(client, False)
            with contextlib.suppress(OSError):
                client.close()

    def _hold(self, generation: int) -> bool:
        """Wait while the fault set at `generation` stays; False when the proxy stops."""
        with self._switch.changed:
            while self._switch.generation == generation and not self._stopped.is_set():
                self._switch.changed.wait(POLL_SECONDS)
        return not self._stopped.is_set()

    def _answer_faulted(
        self, peer: h11.Connection, client: socket.socket, target: str, fault: Fault | None
    ) -> bool:
        """Answer (or not) as the fault says; False when the request should go upstream."""
        if fault is None:
            return False
        if fault.kind == "latency":
            time.sleep(fault.seconds)
            return False
        if fault.kind == "reset":
            _reset(client)
            raise OSError("reset by the fault")
        if fault.kind == "silence":
            self._hold(self._switch.generation)
            raise OSError("silenced by the fault")  # the client gave up long ago, or will now
        if fault.kind == "status":
            _send_status(peer, client, fault.code, fault.retry_after)
            return True
        if fault.kind == "gone_on_resume":
            query = parse_qs(urlsplit(target).query)
            if query.get("watch") == ["true"] and query.get("resourceVersion", ["0"])[0] not in (
                "",
                "0",
            ):
                _send_status(peer, client, 410, None)
                return True
            return False
        raise ValueError(f"unknown fault {fault.kind!r}")

    def _forward(
        self,
        peer: h11.Connection,
        client: socket.socket,
        upstream: _Upstream,
        request: h11.Request,
        body: bytes,
    ) -> bool:
        """Send the request upstream and relay the answer as it streams; False: close."""
        upstream.send(request, body)
        generation = self._switch.generation
        while True:
            event = upstream.next_event()
            if event is None:  # nothing yet: look at the fault
                fault = self._switch.fault
                if self._switch.generation != generation and fault is not None:
                    if fault.kind == "reset":
                        _reset(client)
                        return False
                    if fault.kind == "silence":
                        self._hold(self._switch.generation)
                        return False
                    if fault.kind in ("status", "gone_on_resume"):
                        return False  # as a restarted server: the stream ends, its resume meets it
                continue
            if isinstance(event, h11.ConnectionClosed):
                return False
            if isinstance(event, h11.InformationalResponse):
                continue
            client.sendall(peer.send(event) or b"")
            if isinstance(event, h11.EndOfMessage):
                upstream.next_cycle()
                return True


class _Upstream:
    """One TLS connection to the API server, opened on first use, for one client connection."""

    def __init__(self, address: tuple[str, int], tls: ssl.SSLContext) -> None:
        raw = socket.create_connection(address, timeout=10)
        self.sock = tls.wrap_socket(raw)
        self.sock.settimeout(POLL_SECONDS)
        self.conn = h11.Connection(h11.CLIENT)

    def send(self, request: h11.Request, body: bytes) -> None:
        out = self.conn.send(request) or b""
        if body:
            out += self.conn.send(h11.Data(data=body)) or b""
        out += self.conn.send(h11.EndOfMessage()) or b""
        self.sock.sendall(out)

    def next_event(self) -> h11.Event | None:
        while True:
            event = self.conn.next_event()
            if event is not h11.NEED_DATA:
                return event  # type: ignore[return-value]
            try:
                data = self.sock.recv(READ_SIZE)
            except TimeoutError:
                return None
            self.conn.receive_data(data)

    def next_cycle(self) -> None:
        if self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE:
            self.conn.start_next_cycle()
        else:
            raise OSError("upstream connection cannot be reused")

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


def _read_request(peer: h11.Connection, sock: socket.socket) -> tuple[h11.Request | None, bytes]:
    request: h11.Request | None = None
    body = bytearray()
    while True:
        event = peer.next_event()
        if event is h11.NEED_DATA:
            data = sock.recv(READ_SIZE)
            peer.receive_data(data)
            continue
        if isinstance(event, h11.ConnectionClosed):
            return None, b""
        if isinstance(event, h11.Request):
            request = event
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            return request, bytes(body)


REASONS = {401: "Unauthorized", 410: "Expired", 429: "TooManyRequests", 503: "ServiceUnavailable"}


def _send_status(
    peer: h11.Connection, sock: socket.socket, code: int, retry_after: int | None
) -> None:
    reason = REASONS.get(code, "InternalError")
    body = (
        '{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",'
        f'"message":"injected by the fault proxy","reason":"{reason}","code":{code}}}'
    ).encode()
    headers = [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
    if retry_after is not None:
        headers.append(("Retry-After", str(retry_after)))
    out = peer.send(h11.Response(status_code=code, headers=headers)) or b""
    out += peer.send(h11.Data(data=body)) or b""
    out += peer.send(h11.EndOfMessage()) or b""
    sock.sendall(out)


def _reset(sock: socket.socket) -> None:
    """Close with an RST (SO_LINGER 0), as a peer that died or a middlebox would."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()
