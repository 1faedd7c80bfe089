"""Ambient on the soak's bed: the ztunnel stand-in of each node (testbed/ztunnel_double.py,
strict: every ZDS message checked as ztunnel would) on that node's ZDS socket, kept connected
as ztunnel keeps itself (a killed or replaced agent's socket goes away; ztunnel connects to the
new one and takes its snapshot), and restarted fresh by the `ztunnel_restart` fault; and the
churn's check that an ambient pod ran captured from its first instant.

An ambient pod's app is `connect-loop` to an address outside the cluster from its first instant
(as in the node tier's reboot test): each connection is answered by the stand-in's listener in
the pod (`ztunnel-double|<uid>|15001`) or refused at once (redirected in the pod, nothing
listening yet), never one that left the pod (kubepods.escaped). With that, the pod must be
enrolled: annotated `ambient.istio.io/redirection: enabled`, ambient's in-pod rules in its
netns, and its node's stand-in sent its AddWorkload.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from bench.soak.rechecks import Rechecks
from testbed import kubepods
from testbed.ztunnel_double import ZtunnelDouble, api_identity, redirects

ZDS_DIR = "/var/run/ztunnel"
"""The dir of the chart's default `ambient.ztunnelSocketPath`: a dir of its own on each node
of the bed (the layout binds it), so each node's agent serves its own socket."""
ZDS_SOCKET = f"{ZDS_DIR}/ztunnel.sock"
MODE_LABEL = "istio.io/dataplane-mode"
ANNOTATION = "ambient.istio.io/redirection"
OUTSIDE = ("203.0.113.10", 80)
"""TEST-NET-3: never routed; a connection that leaves the pod fails (unreachable, timed out)."""
CONNECT_LOOP = ("connect-loop", OUTSIDE[0], str(OUTSIDE[1]), "0.5")
ANSWERED = "ztunnel-double|"
FIRST_CONNECT_S = 15.0
"""How long after a pod is seen Running its app's first connection may take to be logged
(it is made at once; a connection out of the pod times out in 5 s): past it, the pod is judged
on its enrolment alone."""
RECHECK_S = 1.0
"""How often an undecided pod's log and netns are read again."""
RECONNECT_S = 0.2
"""How often a disconnected stand-in tries the agent's socket (ztunnel retries the same way)."""
KEEP_UNHELD = re.compile(r"KeepWorkload \S+: a pod this ztunnel does not hold")
"""The one thing the stand-in flags that the bed lets through, counted apart (`tolerated`): an
agent started anew keeps, in its first snapshot, the pods annotated `enabled` whose netns it
cannot find (as Istio's agent does), which a ztunnel started since (a restart, a node's reboot)
does not hold (the node tier's reboot test lets the same through). A `pending` pod is not kept."""


def captured_line(line: str) -> bool:
    """A connection that stayed in the pod: answered by the ztunnel stand-in there, or refused
    at once (redirected to a port nothing listens on yet)."""
    return "connect " in line and (ANSWERED in line or "Connection refused" in line)


def verdict(
    log: Iterable[str], *, annotation: str | None, rules: bool, added: bool, waited: float
) -> bool | None:
    """Did the pod run captured from its first instant? `log`: its app's lines so far;
    `waited`: seconds since it was seen Running. None: cannot tell yet (no connection logged,
    or not enrolled yet, within FIRST_CONNECT_S)."""
    connects = [s for s in log if "connect " in s]
    if any(kubepods.escaped(s) for s in connects):
        return False
    enrolled = annotation == "enabled" and rules and added
    if waited < FIRST_CONNECT_S and not (connects and enrolled):
        return None
    return enrolled and all(captured_line(s) for s in connects)


class NodeZtunnel:
    """One node's ztunnel stand-in, kept connected to the agent's socket at `socket_path` (as
    the machine sees it) by a thread of its own; `restart` makes it a fresh one."""

    def __init__(self, node: str, socket_path: Path, core: Any) -> None:
        self.node = node
        self.double = ZtunnelDouble(str(socket_path), identity=api_identity(core))
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._keep, name=f"ztunnel-{node}", daemon=True)
        self._snapshots_before = 0
        """SnapshotSent received before the last restart (0: not restarted, the first one
        awaited)."""

    def start(self) -> None:
        self._thread.start()

    def _keep(self) -> None:
        while not self._stopping.wait(RECONNECT_S):
            with self._lock:
                if not self.double.connected:
                    with contextlib.suppress(OSError):  # the agent's socket not there yet
                        self.double.connect()

    def restart(self) -> None:
        """A new ztunnel process: nothing held, a fresh connection (made by the keeper when
        the agent does not accept it at once)."""
        with self._lock:
            self._snapshots_before = self.double.snapshots
            # OSError: disconnected and emptied already; the keeper connects.
            with contextlib.suppress(OSError):
                self.double.restart()

    def added(self, uid: str) -> bool:
        """Did the agent ever send this pod's AddWorkload (with its netns) to this node?"""
        return ("add", uid, True) in self.double.requests

    def has_snapshot_of(self, uids: Iterable[str]) -> bool:
        """Since the start or the last restart: connected, a snapshot received, and every pod
        of `uids` held."""
        if not self.double.connected or self.double.snapshots <= self._snapshots_before:
            return False
        return set(uids) <= set(self.double.workloads())

    def held(self) -> list[str]:
        return [f"{w.namespace}/{w.name} ({uid})" for uid, w in self.double.workloads().items()]

    @property
    def violations(self) -> list[str]:
        """What the agent sent that ztunnel would not take, but KEEP_UNHELD."""
        return [v for v in self.double.violations if not KEEP_UNHELD.fullmatch(v)]

    @property
    def tolerated(self) -> list[str]:
        return [v for v in self.double.violations if KEEP_UNHELD.fullmatch(v)]

    def close(self) -> None:
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(10)
        with contextlib.suppress(AssertionError):  # the violations are the bed's to report
            self.double.close()


class AmbientCheck:
    """The churn's `captured` for ambient pods (the API's Running pod -> bool | None)."""

    def __init__(
        self,
        core: Any,
        namespace: str,
        netns: Callable[[str], str],
        standins: Mapping[str, NodeZtunnel],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.core, self.namespace, self.netns = core, namespace, netns
        self.standins = standins
        self._rechecks = Rechecks(RECHECK_S, clock)

    def __call__(self, item: Any) -> bool | None:
        uid = item.metadata.uid
        waited = self._rechecks.due(uid)
        if waited is None:
            return None
        log = kubepods.logs(self.core, self.namespace, item.metadata.name, "app").splitlines()
        standin = self.standins.get(item.spec.node_name)
        found = verdict(
            log,
            annotation=(item.metadata.annotations or {}).get(ANNOTATION),
            rules=netns_redirects(self.netns(uid)),
            added=standin is not None and standin.added(uid),
            waited=waited,
        )
        if found is not None:
            self._rechecks.judged(uid)
        return found


def netns_redirects(netns: str) -> bool:
    """Does the netns at this path hold ambient's in-pod rules (either iptables flavour, or
    Istio's nftables table)?"""
    fd = os.open(netns, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return redirects(fd)
    finally:
        os.close(fd)
