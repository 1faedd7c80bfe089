"""The HTTP port every pod on the node can reach (/healthz, /readyz, /metrics), served by the
agent's own HttpServer on loopback; the fuzzer's bytes are what a hostile pod sends.
Contract: bench/doors/http_peer.py (well-formed replies, no 500, still serving).

The /metrics page is built for every scrape here (period 0): the agent's builds it at most once
a second, so a scrape within a second of the last waits for the next build, which would hold
most of the fuzzer's inputs for its whole read deadline (tests/lifecycle/test_http_server.py
covers that rate)."""

from __future__ import annotations

import socket

from agent.http_server import HttpServer, MetricsPage
from bench.doors import http_peer

SEEDS = [
    b"\0" + seed
    for seed in [
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /readyz HTTP/1.1\r\n\r\nGET /metrics HTTP/1.1\r\n\r\nHEAD /healthz HTTP/1.0\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nContent-Length: 12\r\nConnection: close\r\n\r\nhello world!",
        b"POST /metrics HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\nx",
        # Many pipelined requests in one write; a long numeric header (each once ended the loop).
        b"GET /healthz HTTP/1.1\r\n\r\n" * 260,
        b"GET /healthz HTTP/1.1\r\nContent-Length: " + b"9" * 4400 + b"\r\n\r\n",
    ]
]
_server: HttpServer | None = None
DICTIONARY = http_peer.DICTIONARY


def _connect() -> socket.socket:
    assert _server is not None
    return socket.create_connection(("127.0.0.1", _server.bound_port), timeout=2)


def setup() -> None:
    global _server
    page = MetricsPage(period=0.0)
    # Every input and probe from one address: the request budget (tests/serving/test_budget.py)
    # would answer most of them 429; what is fuzzed here is the reading and answering.
    _server = HttpServer(port=0, host="127.0.0.1", readiness=lambda: (), metrics=page, rates=None)
    _server.start()


def teardown() -> None:
    global _server
    server, _server = _server, None
    if server is not None:
        server.stop()


def one_input(data: bytes) -> None:
    http_peer.judge(http_peer.converse(_connect, http_peer.chunks_of(data)))
    http_peer.probe(_connect, b"GET /healthz HTTP/1.1\r\n\r\n", b"HTTP/1.1 200")
