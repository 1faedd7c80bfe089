"""Test client: usage echo_client.py tcp|udp HOST PORT -> prints the server's answer."""

import socket
import sys


def main():
    proto, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    if proto == "tcp":
        with socket.create_connection((host, port), timeout=3) as sock:
            print(sock.recv(2048).decode())
    else:
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.settimeout(3)
            sock.sendto(b"q", (host, port))
            print(sock.recv(2048).decode())


if __name__ == "__main__":
    main()
