# helm test: the proxy stand-in of the capture test pod (its istio-proxy container, uid 1337).
# Answers every connection on 15001 with the connection's original destination, as the
# capture's REDIRECT left it (SO_ORIGINAL_DST), until the check container is done.
import contextlib
import os
import socket
import struct
import threading
import time

PORT, DONE, DEADLINE = 15001, "/run/test/done", time.monotonic() + 300
SO_ORIGINAL_DST = 80  # IP6T_SO_ORIGINAL_DST has the same number


def original_dst(conn, family):
    try:
        if family == socket.AF_INET:
            raw = conn.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
            address = socket.inet_ntop(socket.AF_INET, raw[4:8])
        else:
            raw = conn.getsockopt(socket.IPPROTO_IPV6, SO_ORIGINAL_DST, 28)
            address = "[" + socket.inet_ntop(socket.AF_INET6, raw[8:24]) + "]"
    except OSError:
        return "none"
    return f"{address}:{struct.unpack('!H', raw[2:4])[0]}"


def serve(srv, family):
    while True:
        try:
            conn, _ = srv.accept()
        except TimeoutError:
            continue
        with conn:
            line = f"istio-cni-test-proxy original_dst={original_dst(conn, family)}\n"
            conn.sendall(line.encode())


def listen(family, host):
    srv = socket.socket(family, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6:
        srv.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    srv.bind((host, PORT))
    srv.listen(16)
    srv.settimeout(1)
    threading.Thread(target=serve, args=(srv, family), daemon=True).start()


listen(socket.AF_INET, "0.0.0.0")
with contextlib.suppress(OSError):  # a pod without IPv6
    listen(socket.AF_INET6, "::")
while not os.path.exists(DONE) and time.monotonic() < DEADLINE:
    time.sleep(0.2)
