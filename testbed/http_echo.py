"""A pod's app: an HTTP server that answers every GET with its label and the two ends of the
connection as it saw them, so a test can tell who reached it and from which address.

Run as a process in the pod's netns: `python http_echo.py LABEL PORT [PORT...]`; prints "ready"
once every port listens. `get()` is the client side (from a thread in the calling pod's netns).
"""

from __future__ import annotations

import http.client
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TIMEOUT = 5.0


def _address(pair: tuple[Any, ...]) -> str:
    host, port = pair[0], pair[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class _Handler(BaseHTTPRequestHandler):
    label = ""

    def do_GET(self) -> None:
        body = json.dumps(
            {
                "app": self.label,
                "peer": _address(self.client_address),
                "local": _address(self.connection.getsockname()),
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # quiet: the answer says it all
        del format, args


def get(host: str, port: int, path: str = "/") -> tuple[dict[str, Any], str]:
    """(the app's answer, this connection's own local address): one request, one connection."""
    conn = http.client.HTTPConnection(host, port, timeout=TIMEOUT)
    try:
        conn.connect()
        assert conn.sock is not None
        local = _address(conn.sock.getsockname())
        conn.request("GET", path)
        response = conn.getresponse()
        body = response.read()
        if response.status != 200:
            raise OSError(f"GET http://{host}:{port}{path}: {response.status} {body[:200]!r}")
        answer: dict[str, Any] = json.loads(body)
        return answer, local
    finally:
        conn.close()


def main(argv: list[str]) -> None:
    label, ports = argv[0], [int(p) for p in argv[1:]]
    handler = type("Handler", (_Handler,), {"label": label})
    servers = [ThreadingHTTPServer(("0.0.0.0", port), handler) for port in ports]
    for server in servers:
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
    print("ready", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main(sys.argv[1:])
