"""A hostile peer of the agent's HTTP doors, run as its own process (its work never shares the
caller's GIL), repeating each chosen attack until stdin closes or `duration` ends:

    python -m testbed.attacks --target tcp:HOST:PORT|unix:PATH [--target ...]
                              [--pipelined N] [--long-length DIGITS]
                              [--metrics-flood CONNECTIONS,BATCH] [--pause SECONDS]
                              [--duration SECONDS]

- pipelined: N requests in one write on one connection (`GET /healthz` on TCP, the pod socket's
  status request on a Unix socket), every reply read;
- long-length: one request whose Content-Length has DIGITS digits (past Python's int limit);
- metrics-flood (TCP): CONNECTIONS connections, each sending BATCH `GET /metrics` in one write,
  again and again.

Each attack is repeated `--pause` seconds after its last round ended (default 0.05: a sustained
flood, which costs the agent CPU per request; 1: the attack as a neighbour repeats it).

Prints one JSON line when the first round is done (`{"ready": true}`), and at the end one with,
per attack, its rounds, the replies it read and the connections the door refused (a door that
stopped accepting shows there). Only to addresses on this machine and the caller's own sockets.
"""

from __future__ import annotations

import argparse
import json
import select
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial

POD_STATUS = "/v1/status"
READ_TIMEOUT = 5.0
PAUSE = 0.05
"""Default seconds between two rounds of one attack."""


@dataclass
class Count:
    rounds: int = 0
    replies: int = 0
    refused: int = 0
    errors: int = 0


def connect(target: str) -> socket.socket:
    kind, _, rest = target.partition(":")
    if kind == "unix":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(READ_TIMEOUT)
        sock.connect(rest)
        return sock
    host, _, port = rest.rpartition(":")
    return socket.create_connection((host, int(port)), timeout=READ_TIMEOUT)


def exchange(target: str, payload: bytes, count: Count) -> None:
    """One connection: `payload` sent, then every reply read until the server closes."""
    try:
        sock = connect(target)
    except OSError:
        count.refused += 1
        return
    try:
        sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR)
        data = bytearray()
        while chunk := sock.recv(1 << 16):
            data += chunk
        count.replies += data.count(b"HTTP/1.1 ")
    except OSError:
        count.errors += 1
    finally:
        sock.close()
        count.rounds += 1


def request(target: str, path: str = "/healthz") -> bytes:
    if target.startswith("unix:") and path == "/healthz":
        path = POD_STATUS
    return f"GET {path} HTTP/1.1\r\nHost: agent\r\n\r\n".encode()


def attacks(args: argparse.Namespace) -> dict[str, Callable[[Count], None]]:
    made: dict[str, Callable[[Count], None]] = {}
    for target in args.target:
        if args.pipelined:
            made[f"pipelined {target}"] = partial(
                exchange, target, request(target) * args.pipelined
            )
        if args.long_length:
            head = f"GET /healthz HTTP/1.1\r\nContent-Length: {'9' * args.long_length}\r\n\r\n"
            made[f"long-length {target}"] = partial(exchange, target, head.encode())
        if args.metrics_flood and target.startswith("tcp:"):
            conns, batch = (int(x) for x in args.metrics_flood.split(","))
            payload = request(target, "/metrics") * batch
            for i in range(conns):
                made[f"metrics {i} {target}"] = partial(exchange, target, payload)
    return made


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed.attacks")
    parser.add_argument("--target", action="append", default=[])
    parser.add_argument("--pipelined", type=int, default=0)
    parser.add_argument("--long-length", type=int, default=0)
    parser.add_argument("--metrics-flood", default="")
    parser.add_argument("--pause", type=float, default=PAUSE)
    parser.add_argument("--duration", type=float, default=120.0)
    args = parser.parse_args(argv)
    deadline = time.monotonic() + args.duration
    stop = threading.Event()
    counts = {name: Count() for name in attacks(args)}
    started = threading.Barrier(len(counts) + 1)

    def repeat(name: str, attack: Callable[[Count], None]) -> None:
        attack(counts[name])
        started.wait()
        while not stop.is_set() and time.monotonic() < deadline:
            attack(counts[name])
            stop.wait(args.pause)

    threads = [
        threading.Thread(target=repeat, args=(n, a), daemon=True) for n, a in attacks(args).items()
    ]
    for thread in threads:
        thread.start()
    started.wait()
    print(json.dumps({"ready": True}), flush=True)
    while time.monotonic() < deadline:  # until stdin closes (the caller is done) or time is up
        readable, _, _ = select.select([sys.stdin], [], [], 0.2)
        if readable and not sys.stdin.readline():
            break
    stop.set()
    for thread in threads:
        thread.join(READ_TIMEOUT * 2)
    print(json.dumps({name: asdict(c) for name, c in counts.items()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
