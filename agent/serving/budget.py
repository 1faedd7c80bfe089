"""How many requests a door answers per second: the share of the agent's CPU its peers can take.

Reading and answering one request costs the loop's thread some 120 us of Python (h11 reads it),
and that thread shares the GIL with the CNI ADDs the pod socket's workers answer: 8,000 requests
a second on the HTTP port tripled the ADD p99 (bench/README "a sustained request flood"). The
HTTP port is reachable from every pod on the node, so its answers have a budget, token buckets
refilled continuously:

- the port as a whole: `rate` requests a second (`burst` at once);
- each peer address: `peer_rate` (`peer_burst`): one pod cannot spend the port's budget alone.
  A TCP peer's address is the kernel's word, proven by the handshake: nothing in the request
  (a header, a User-Agent) is trusted;
- probes apart: a request for a `probe_paths` path the budgets above refuse is still answered
  while its peer's own probe allowance (`probe_rate`, `probe_burst`) lasts. Kubelet probes from
  the node's own address, which no pod has: a flood from pods, however many, spends its own
  allowances and never kubelet's, so /healthz and /readyz stay answered. What probes can add
  is bounded by the peers tracked (`max_peers`) times `probe_rate`.

Kubelet's address is the node's, and a hostNetwork pod has it too: once that address's budget is
contested (it refused something in the last `CONTESTED_SECONDS`, or half of a bucket is spent), a
connection from it is charged to the node's own processes (`NODE`) when one of them made it
(agent.serving.node_processes), so that kubelet's probes draw on an allowance the pod's flood
cannot spend. Finding that out costs some 20 us a connection from the node's address, a listing
of the known node processes' descriptors (a few hundred for kubelet) at most every 50 ms, and a
scan of every process's at most once a second for connections none of them holds, which wait
for it unread (at most 256: agent.serving.origins), so that a pod's flood from the node's
address is slowed to a few connections a second.

A request over budget is answered 429 and its connection closed (what the peer had pipelined
behind it is never read), and spends a token of its peer's probe allowance; a connection from a
peer with neither left is closed as it is accepted, before a byte of it is read. Peers are
tracked in a table of at most `max_peers`, least recently seen dropped first: a dropped peer
comes back with a full budget, so the table's size bounds the memory, and the port's rate still
bounds the CPU.
"""

from __future__ import annotations

import ipaddress
import socket
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from agent.serving.node_processes import NodeProcesses

NODE = "node"
"""The budget of connections the node's own processes made from its address (not an address)."""

CONTESTED_SECONDS = 10.0


class Bucket:
    """A token bucket: `rate` tokens a second, at most `burst` held; starts full."""

    __slots__ = ("at", "burst", "rate", "tokens")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.at = now

    def _refill(self, now: float) -> None:
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now

    def has(self, now: float) -> bool:
        """A token is there (none taken)."""
        self._refill(now)
        return self.tokens >= 1.0

    def take(self, now: float) -> bool:
        self._refill(now)
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True


@dataclass(frozen=True)
class Rates:
    """One door's budget (see the module's docstring)."""

    rate: float
    burst: float
    peer_rate: float
    peer_burst: float
    probe_rate: float
    probe_burst: float
    probe_paths: frozenset[str]
    max_peers: int = 1024


HTTP = Rates(
    rate=200.0,
    burst=200.0,
    peer_rate=50.0,
    peer_burst=100.0,
    probe_rate=5.0,
    probe_burst=10.0,
    probe_paths=frozenset({"/healthz", "/readyz"}),
)
"""The HTTP port: kubelet probes a few times a minute and Prometheus scrapes every few seconds;
200 requests a second is some 2.5% of a core, 50 a peer."""


class _Peer:
    __slots__ = ("probes", "refused_at", "requests")

    def __init__(self, rates: Rates, now: float) -> None:
        self.requests = Bucket(rates.peer_rate, rates.peer_burst, now)
        self.probes = Bucket(rates.probe_rate, rates.probe_burst, now)
        self.refused_at = -CONTESTED_SECONDS

    def contested(self, now: float) -> bool:
        """Something was refused lately, or half a bucket is spent."""
        if now - self.refused_at < CONTESTED_SECONDS:
            return True
        self.requests.has(now)  # refilled to now
        self.probes.has(now)
        return (
            self.requests.tokens < self.requests.burst / 2
            or self.probes.tokens < self.probes.burst / 2
        )


class Budget:
    """The requests one door may still answer, by peer address. Used by one thread (its loop)."""

    def __init__(
        self,
        rates: Rates,
        *,
        clock: Callable[[], float] = time.monotonic,
        node: NodeProcesses | None = None,
    ) -> None:
        """`node`: tells the node's processes' connections from its address apart (None: every
        connection is charged to its address)."""
        self.rates = rates
        self._clock = clock
        self._port = Bucket(rates.rate, rates.burst, clock())
        self._peers: OrderedDict[str, _Peer] = OrderedDict()
        self.node = node

    def asks_who(self, sock: socket.socket, address: str) -> bool:
        """Whether who made a new connection from `address` is worth finding out: its address
        is the node's and contested, or a scan of the node's processes is due (so that those
        probing the agent are known before any flood: agent.serving.node_processes); a
        connection one of them made is then charged to `NODE`."""
        if self.node is None or not _from_this_node(sock, address):
            return False
        peer = self._peers.get(address)
        return (peer is not None and peer.contested(self._clock())) or self.node.scan_due()

    def _peer(self, address: str, now: float) -> _Peer:
        peer = self._peers.get(address)
        if peer is None:
            peer = self._peers[address] = _Peer(self.rates, now)
            while len(self._peers) > self.rates.max_peers:
                self._peers.popitem(last=False)
        else:
            self._peers.move_to_end(address)
        return peer

    def connection(self, address: str) -> bool:
        """Whether a new connection from `address` is worth reading: its peer can still be
        answered something (a request, or a probe)."""
        now = self._clock()
        peer = self._peer(address, now)
        if peer.requests.has(now) or peer.probes.has(now):
            return True
        peer.refused_at = now
        return False

    def request(self, address: str, path: str) -> bool:
        """Whether a request for `path` from `address` is answered (its token taken)."""
        now = self._clock()
        peer = self._peer(address, now)
        if peer.requests.has(now) and self._port.take(now):
            peer.requests.take(now)
            return True
        if path in self.rates.probe_paths and peer.probes.take(now):
            return True
        peer.refused_at = now
        # A refusal costs its peer's probe allowance too: once both are spent, its connections
        # are closed unread, so even a flood of refused requests costs little.
        peer.probes.take(now)
        return False


def _from_this_node(sock: socket.socket, address: str) -> bool:
    """The peer is on this node: it has our own address, or a loopback one."""
    try:
        if address == str(sock.getsockname()[0]):
            return True
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except (OSError, ValueError):
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback
