#!/usr/bin/python3
"""A plain test application for the test bed's pods (a stand-in for a user's workload).

    app.py serve PORT [PORT...]    listen (IPv4 and IPv6 when present) and answer every connection
                                   with "app port=PORT peer=ADDR" followed by what it sent, echoed
    app.py connect HOST PORT       connect, send "hello", print the reply and " from=ADDR", the
                                   app's own end of the connection (or "error: ...", exit 1):
                                   a reply whose peer is not that address came through a proxy
    app.py connect-loop HOST PORT [INTERVAL]
                                   connect every INTERVAL s (default 1) forever, printing each
                                   result on one line: for tests that read the container log
                                   instead of exec-ing into the pod
    app.py sleep                   do nothing until SIGTERM

Every line is also printed on stdout, prefixed with the time, so container logs tell the story.
"""

from __future__ import annotations

import signal
import socket
import sys
import threading
import time


def log(line: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {line}", flush=True)


def fmt(addr: tuple[object, ...]) -> str:
    host = str(addr[0])
    if host.startswith("::ffff:"):
        host = host[7:]
    return f"[{host}]:{addr[1]}" if ":" in host else f"{host}:{addr[1]}"


def handle(conn: socket.socket, port: int, peer: tuple[object, ...]) -> None:
    with conn:
        conn.settimeout(5)
        greeting = f"app port={port} peer={fmt(peer)}"
        log(greeting)
        try:
            data = conn.recv(4096)
            conn.sendall(f"{greeting} echo={data.decode(errors='replace').strip()}\n".encode())
        except OSError as e:
            log(f"app port={port} peer={fmt(peer)} error: {e}")


def serve(ports: list[int]) -> int:
    for port in ports:
        try:
            s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("::", port))
        except OSError:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("0.0.0.0", port))
        s.listen(64)

        def accept(s: socket.socket = s, port: int = port) -> None:
            while True:
                conn, peer = s.accept()
                threading.Thread(target=handle, args=(conn, port, peer), daemon=True).start()

        threading.Thread(target=accept, daemon=True).start()
    log(f"app listening on {' '.join(map(str, ports))}")
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    return 0


def connect(host: str, port: int, timeout: float = 5.0) -> tuple[bool, str]:
    try:
        with socket.create_connection((host, port), timeout=timeout) as c:
            mine = fmt(c.getsockname())
            c.sendall(b"hello\n")
            c.shutdown(socket.SHUT_WR)
            reply = b""
            while chunk := c.recv(4096):
                reply += chunk
            text = reply.decode(errors="replace").strip() or "(empty reply)"
            return True, f"{text} from={mine}"
    except OSError as e:
        return False, f"error: {e}"


def main(argv: list[str]) -> int:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    if len(argv) >= 2 and argv[0] == "serve":
        return serve([int(p) for p in argv[1:]])
    if len(argv) == 3 and argv[0] == "connect":
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})
        ok, text = connect(argv[1], int(argv[2]))
        print(f"connect {argv[1]}:{argv[2]} {text}", flush=True)
        return 0 if ok else 1
    if len(argv) in (3, 4) and argv[0] == "connect-loop":
        interval = float(argv[3]) if len(argv) == 4 else 1.0
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        while True:
            ok, text = connect(argv[1], int(argv[2]))
            log(f"connect {argv[1]}:{argv[2]} {text}")
            time.sleep(interval)
    if argv == ["sleep"]:
        signal.sigwait({signal.SIGTERM, signal.SIGINT})
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
