"""The inode of the socket at the other end of a TCP connection made on this node: the kernel's
sock_diag, asked for that one socket by its four-tuple.

Whoever made a connection to us from this node holds the socket at its other end, and its inode is
what the node's /proc names among a process's descriptors (agent.serving.node_processes). An exact
lookup is one request and one reply (some 20 us), whatever the number of sockets on the node; a
dump walks every socket of the node (2.3 ms with 7,000 of them, even filtered in the kernel), and
pyroute2's DiagSocket (0.9) offers dumps only.
"""

from __future__ import annotations

import errno
import ipaddress
import itertools
import socket
import struct

_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLMSG_ERROR = 2
_NLM_F_REQUEST = 1
_NOCOOKIE = 0xFFFFFFFF
_ALL_STATES = 0xFFFFFFFF

_HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, seq, pid
_REQUEST = struct.Struct("=BBBxI2s2s16s16sIII")  # inet_diag_req_v2 with its inet_diag_sockid
_MESSAGE = struct.Struct("=BBBB2s2s16s16sIIIIIIII")  # inet_diag_msg
_ERROR = struct.Struct("=i")

_seq = itertools.count(1)


def _family_and_bytes(address: str) -> tuple[int, bytes]:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # an IPv4 client of a dual-stack listener holds an IPv4 socket
    family = socket.AF_INET if ip.version == 4 else socket.AF_INET6
    return family, ip.packed.ljust(16, b"\0")


def peer_socket_inode(sock: socket.socket) -> int | None:
    """The inode of the socket at the other end of `sock` (an accepted TCP connection whose peer
    is in this network namespace); None when the kernel knows no such socket held by a process
    (the peer closed it, or it is not on this node)."""
    peer_address, peer_port = sock.getpeername()[:2]
    our_address, our_port = sock.getsockname()[:2]
    family, peer_bytes = _family_and_bytes(str(peer_address))
    _, our_bytes = _family_and_bytes(str(our_address))
    # The peer's socket: its local end is our peer, its remote end is us.
    body = _REQUEST.pack(
        family,
        socket.IPPROTO_TCP,
        0,
        _ALL_STATES,
        struct.pack("!H", peer_port),
        struct.pack("!H", our_port),
        peer_bytes,
        our_bytes,
        0,
        _NOCOOKIE,
        _NOCOOKIE,
    )
    seq = next(_seq) & 0xFFFFFFFF
    header = _HEADER.pack(_HEADER.size + len(body), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, seq, 0)
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as nl:
        nl.settimeout(1.0)
        nl.send(header + body)
        reply = nl.recv(8192)
    return _inode_of_reply(reply, seq)


def _inode_of_reply(reply: bytes, seq: int) -> int | None:
    if len(reply) < _HEADER.size:
        return None
    length, kind, _, got_seq, _ = _HEADER.unpack_from(reply)
    if got_seq != seq or length > len(reply):
        return None
    if kind == _NLMSG_ERROR:
        (code,) = _ERROR.unpack_from(reply, _HEADER.size)
        if -code in (errno.ENOENT, 0):
            return None
        raise OSError(-code, f"sock_diag lookup: {errno.errorcode.get(-code, -code)}")
    if kind != _SOCK_DIAG_BY_FAMILY or length < _HEADER.size + _MESSAGE.size:
        return None
    fields = _MESSAGE.unpack_from(reply, _HEADER.size)
    return int(fields[-1]) or None  # 0: an orphan (closed by its process), held by none
