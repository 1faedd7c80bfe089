"""Test echo server: answers on each given port with 'LABEL|HOST:PORT' (HOST:PORT = local address).

usage: echo_server.py tcp:PORT:LABEL[:transparent] udp:PORT:LABEL ...   (prints 'ready')
Binds IPv4 and IPv6 separately; 'transparent' sets IP_TRANSPARENT (TPROXY needs it).
"""

import socket
import sys
import threading

IP_TRANSPARENT = 19
IPV6_TRANSPARENT = 75


def reply(label, sockname):
    host, port = sockname[0], sockname[1]
    return f"{label}|{host}:{port}".encode()


def tcp(sock, label):
    while True:
        conn, _ = sock.accept()
        with conn:
            conn.sendall(reply(label, conn.getsockname()))


def udp(sock, label):
    while True:
        _, peer = sock.recvfrom(2048)
        sock.sendto(reply(label, sock.getsockname()), peer)


def main():
    threads = []
    for spec in sys.argv[1:]:
        proto, port, label, *flags = spec.split(":")
        for family, host in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
            kind = socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM
            sock = socket.socket(family, kind)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if "transparent" in flags:
                if family == socket.AF_INET:
                    sock.setsockopt(socket.SOL_IP, IP_TRANSPARENT, 1)
                else:
                    sock.setsockopt(socket.IPPROTO_IPV6, IPV6_TRANSPARENT, 1)
            sock.bind((host, int(port)))
            if proto == "tcp":
                sock.listen(16)
            target = tcp if proto == "tcp" else udp
            threads.append(threading.Thread(target=target, args=(sock, label), daemon=True))
    for t in threads:
        t.start()
    print("ready", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
