#!/usr/bin/python3
"""Test double of the Istio sidecar's Envoy: it stands in for Envoy, which cannot run here.

Listens on 15001 (outbound capture), 15006 (inbound capture) and 15008 (HBONE) on all IPv4 and,
when the pod has IPv6, IPv6 addresses. For every connection it writes back one line and prints
the same line on stdout (so tests can read it from the container log instead of exec-ing):

    proxy-double port=15001 peer=10.0.0.5:40122 original_dst=203.0.113.10:80

original_dst is getsockopt(SOL_IP, SO_ORIGINAL_DST) (IPv6: SOL_IPV6, IP6T_SO_ORIGINAL_DST), the
address the client dialled before iptables/nftables redirected it (the address it reached when
not redirected; "none" when the kernel tracks no connections in the pod's network namespace).
Listeners are transparent (IP_TRANSPARENT) when the container may make them so (NET_ADMIN, as
Istio's injector grants the proxy in TPROXY mode), as Envoy's inbound listener is there: the
TPROXY target delivers only to transparent sockets, keeping the original destination as the
connection's local address.
Ports: argv, default 15001 15006 15008.
"""

from __future__ import annotations

import signal
import socket
import struct
import sys
import threading

SO_ORIGINAL_DST = 80  # linux/netfilter_ipv4.h
IP6T_SO_ORIGINAL_DST = 80  # linux/netfilter_ipv6/ip6_tables.h
SOL_IPV6 = getattr(socket, "SOL_IPV6", 41)
IP_TRANSPARENT = 19  # linux/in.h
IPV6_TRANSPARENT = 75  # linux/in6.h


def original_dst(conn: socket.socket, peer: tuple[object, ...]) -> str:
    try:
        # An IPv4 client on the dual-stack socket (peer ::ffff:a.b.c.d) has an IPv4 conntrack entry.
        if conn.family == socket.AF_INET6 and not str(peer[0]).startswith("::ffff:"):
            raw = conn.getsockopt(SOL_IPV6, IP6T_SO_ORIGINAL_DST, 28)  # sockaddr_in6
            port = struct.unpack_from("!H", raw, 2)[0]
            return f"[{socket.inet_ntop(socket.AF_INET6, raw[8:24])}]:{port}"
        raw = conn.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)  # sockaddr_in
        port = struct.unpack_from("!H", raw, 2)[0]
        return f"{socket.inet_ntop(socket.AF_INET, raw[4:8])}:{port}"
    except OSError:
        return "none"


def fmt(addr: tuple[object, ...]) -> str:
    host = str(addr[0])
    if host.startswith("::ffff:"):
        host = host[7:]
    return f"[{host}]:{addr[1]}" if ":" in host else f"{host}:{addr[1]}"


def serve(listener: socket.socket, port: int) -> None:
    while True:
        conn, peer = listener.accept()
        threading.Thread(target=answer, args=(conn, peer, port), daemon=True).start()


def answer(conn: socket.socket, peer: tuple[object, ...], port: int) -> None:
    with conn:
        line = f"proxy-double port={port} peer={fmt(peer)} original_dst={original_dst(conn, peer)}"
        print(line, flush=True)
        try:
            conn.sendall(line.encode() + b"\n")
            # Drain what the client sent, so that closing does not reset the connection.
            conn.shutdown(socket.SHUT_WR)
            conn.settimeout(2)
            while conn.recv(4096):
                pass
        except OSError:
            pass


def listen(port: int) -> list[socket.socket]:
    socks = []
    try:  # one dual-stack socket when the pod has IPv6
        s6 = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        s6.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s6.setsockopt(SOL_IPV6, socket.IPV6_V6ONLY, 0)
        s6.bind(("::", port))
        socks.append(s6)
    except OSError:
        s4 = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s4.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s4.bind(("0.0.0.0", port))
        socks.append(s4)
    for s in socks:
        make_transparent(s)
        s.listen(64)
    return socks


def make_transparent(sock: socket.socket) -> None:
    """IP_TRANSPARENT where permitted; without NET_ADMIN (REDIRECT mode) nothing changes."""
    options = [(socket.SOL_IP, IP_TRANSPARENT)]
    if sock.family == socket.AF_INET6:
        options.append((SOL_IPV6, IPV6_TRANSPARENT))
    for level, option in options:
        try:
            sock.setsockopt(level, option, 1)
        except OSError:
            return


def main(argv: list[str]) -> int:
    ports = [int(p) for p in argv] or [15001, 15006, 15008]
    # As PID 1 of its container a signal without a handler is ignored: wait for it explicitly.
    stop = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop)
    for port in ports:
        for s in listen(port):
            threading.Thread(target=serve, args=(s, port), daemon=True).start()
    print(f"proxy-double listening on {' '.join(map(str, ports))}", flush=True)
    signal.sigwait(stop)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
