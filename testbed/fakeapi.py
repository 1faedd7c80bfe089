"""A fake Kubernetes API server on loopback, for the client's behaviour under faults the real one
cannot be made to show on demand (a reset mid-watch, an empty watch, 429 with Retry-After, 401).

It is at least as strict as kube-apiserver where the agent's client is concerned: HTTPS only,
with a certificate from its own CA carrying the IP SAN 127.0.0.1 (the client must trust that CA
and check the address); a request without the expected bearer token is answered 401 with a
Status object; a query parameter the API server does not know is refused 400; a request body
must be JSON of its Content-Type's patch type; every failure is a Status object as the API
server words it. Every request is recorded (monotonic time, method, path, query, connection);
a test sets `route` to answer them: a `Reply` is either a JSON body or a watch stream of events
followed by an end, a connection reset, or silence until the server stops.
"""

from __future__ import annotations

import json
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import yaml

from testbed import pki

QUERY_NAMES = frozenset(
    {
        "fieldSelector",
        "labelSelector",
        "limit",
        "continue",
        "watch",
        "allowWatchBookmarks",
        "resourceVersion",
        "resourceVersionMatch",
        "timeoutSeconds",
        "gracePeriodSeconds",
        "propagationPolicy",
        "dryRun",
        "fieldManager",
    }
)
BODY_TYPES = frozenset(
    {
        "application/json",
        "application/strategic-merge-patch+json",
        "application/merge-patch+json",
        "application/json-patch+json",
    }
)
REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
}


def status(code: int, message: str = "") -> dict[str, Any]:
    """A Status object as the API server sends with a failure."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message or REASONS.get(code, "error"),
        "reason": REASONS.get(code, "Unknown"),
        "code": code,
    }


@dataclass(frozen=True)
class Request:
    at: float
    """time.monotonic() when the request was read."""
    method: str
    path: str
    query: dict[str, str]
    token: str
    connection: int
    """Which TCP connection carried it (numbered from 1 in accept order)."""
    body: Any = None


@dataclass
class Reply:
    status: int = 200
    body: Any = None
    """A JSON object (a Status object for a failure when left None)."""
    headers: dict[str, str] = field(default_factory=dict)
    events: Iterable[dict[str, Any]] | None = None
    """A watch stream: these events, one JSON object a line, then `then`. An iterator may block
    between events: an event that comes later on an open stream."""
    then: str = "end"
    """After the events: "end" (the server ends the watch), "reset" (TCP RST), "silent" (the
    connection stays open and nothing more comes until the server stops)."""


Route = Callable[[Request], Reply]


def not_found(request: Request) -> Reply:
    return Reply(404)


class FakeApiServer:
    """Start with `with FakeApiServer(tmp_path) as server:`; `kubeconfig()` for the client."""

    def __init__(self, directory: Path, *, token: str = "token") -> None:
        self.directory = directory
        self.tokens = {token}
        """Bearer tokens it accepts (a test may change them: a rotated or revoked token)."""
        self.token = token
        self.route: Route = not_found
        self.requests: list[Request] = []
        self.connections = 0
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        ca = pki.make_ca(directory, "fake-apiserver-ca")
        leaf = pki.issue(ca, directory, "apiserver", common_name="fake", server_ips=["127.0.0.1"])
        self.ca = ca.cert
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(leaf.cert), str(leaf.key))
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._httpd.daemon_threads = True
        self._httpd.socket = context.wrap_socket(
            self._httpd.socket, server_side=True, do_handshake_on_connect=False
        )
        self._httpd.fake = self  # type: ignore[attr-defined]
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def __enter__(self) -> FakeApiServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stopped.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)

    def kubeconfig(self, path: Path | None = None) -> Path:
        """A kubeconfig naming this server, its CA (no skip-verify) and the token."""
        path = path or self.directory / "kubeconfig"
        data = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "fake",
                    "cluster": {"server": self.url, "certificate-authority": str(self.ca)},
                }
            ],
            "users": [{"name": "agent", "user": {"token": self.token}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "agent"}}],
            "current-context": "fake",
        }
        path.write_text(yaml.safe_dump(data))
        return path

    def seen(self, method: str = "", path: str = "", **query: str) -> list[Request]:
        """The requests so far with this method, path and query values (each when given)."""
        with self._lock:
            found = list(self.requests)
        return [
            r
            for r in found
            if (not method or r.method == method)
            and (not path or r.path == path)
            and all(r.query.get(k) == v for k, v in query.items())
        ]

    def _record(self, request: Request) -> None:
        with self._lock:
            self.requests.append(request)

    def _connected(self) -> int:
        with self._lock:
            self.connections += 1
            return self.connections


def watch_events(*events: tuple[str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"type": kind, "object": obj} for kind, obj in events]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "fake-kube-apiserver"

    def setup(self) -> None:
        try:
            self.request.do_handshake()
        except (OSError, ssl.SSLError):
            self.request.close()
            raise
        super().setup()
        self.number = self.server.fake._connected()  # type: ignore[attr-defined]

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._serve()

    def do_PATCH(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def do_DELETE(self) -> None:
        self._serve()

    def _serve(self) -> None:
        fake: FakeApiServer = self.server.fake  # type: ignore[attr-defined]
        parts = urlsplit(self.path)
        query = dict(parse_qsl(parts.query, keep_blank_values=True))
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        auth = self.headers.get("Authorization", "")
        token = auth[len("Bearer ") :] if auth.startswith("Bearer ") else ""
        body: Any = None
        refusal = None
        if token not in fake.tokens:
            refusal = Reply(401)
        elif set(query) - QUERY_NAMES:
            refusal = Reply(
                400, status(400, f"unknown query parameter {sorted(set(query) - QUERY_NAMES)}")
            )
        elif raw:
            if self.headers.get("Content-Type") not in BODY_TYPES:
                refusal = Reply(415)
            else:
                try:
                    body = json.loads(raw)
                except ValueError:
                    refusal = Reply(400, status(400, "body is not JSON"))
        request = Request(
            time.monotonic(), self.command, parts.path, query, token, self.number, body
        )
        fake._record(request)
        reply = refusal or fake.route(request)
        if reply.events is None:
            self._send_json(reply)
        else:
            self._send_watch(reply, fake._stopped)

    def _send_json(self, reply: Reply) -> None:
        body = reply.body if reply.body is not None else status(reply.status)
        data = json.dumps(body).encode()
        self.send_response(reply.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _send_watch(self, reply: Reply, stopped: threading.Event) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for event in reply.events or ():
            line = json.dumps(event).encode() + b"\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
            self.wfile.flush()
        if reply.then == "end":
            self.wfile.write(b"0\r\n\r\n")
            return
        if reply.then == "silent":
            stopped.wait()
        else:  # what was sent reaches the client before the reset (a RST drops unread data)
            stopped.wait(0.3)
        # reset: abort the connection (RST), as a dropped link or a killed server does
        self.close_connection = True
        self.request.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.request.close()
