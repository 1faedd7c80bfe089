# helm test: the proxy stand-in of the capture test pod (its istio-proxy container, uid 1337).
# Answers every connection on 15001 with the connection's original destination, as the
# capture's REDIRECT left it (SO_ORIGINAL_DST), until the check container is done.
import os
import socket
import struct
import threading
import time

PORT, DONE, DEADLINE = 15001, "/run/test/done", time.monotonic() + 300


def original_dst(conn, family):
    try:
        if family == socket.AF_INET:
            raw = conn.getsockopt(socket.SOL_IP, 80, 16)  # SO_ORIGINAL_DST
            return "%s:%d" % (socket.inet_ntop(socket.AF_INET, raw[4:8]), struct.unpack("!H", raw[2:4])[0])
        raw = conn.getsockopt(socket.IPPROTO_IPV6, 80, 28)  # IP6T_SO_ORIGINAL_DST
        return "[%s]:%d" % (socket.inet_ntop(socket.AF_INET6, raw[8:24]), struct.unpack("!H", raw[2:4])[0])
    except OSError:
        return "none"


def serve(family, host):
    srv = socket.socket(family, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6:
        srv.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    srv.bind((host, PORT))
    srv.listen(16)
    srv.settimeout(1)
    while True:
        try:
            conn, _ = srv.accept()
        except socket.timeout:
            continue
        with conn:
            conn.sendall(("istio-cni-test-proxy original_dst=%s\n" % original_dst(conn, family)).encode())


threading.Thread(target=serve, args=(socket.AF_INET, "0.0.0.0"), daemon=True).start()
try:
    threading.Thread(target=serve, args=(socket.AF_INET6, "::"), daemon=True).start()
except OSError:
    pass  # no IPv6 in the pod
while not os.path.exists(DONE) and time.monotonic() < DEADLINE:
    time.sleep(0.2)
