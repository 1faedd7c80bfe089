"""Sidecar pods on the soak's bed: a real Envoy as istio-proxy (the `envoy` image), and the
churn's check that a sidecar pod ran captured from its first instant, through that proxy.

A sidecar pod's app is `connect-loop` to the plain echo server on its own node from its first
instant. Each connection is refused at once (redirected to Envoy's port before Envoy listens),
or answered: the answer names the address the server saw (`peer=`) and the app names its own
end of the connection (`from=`). Through Envoy they differ (Envoy's upstream connection, from
the pod's address, port of its own); the same address means the connection left the pod as the
app made it: uncaptured. One answer through the proxy proves the pod captured. With none within
FIRST_CONNECT_S (the server away: its node rebooting, the server's sandbox made anew), the pod
is judged on Istio's rules in its netns alone, as istio-validation did before its app began.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from typing import Any

from bench.soak.rechecks import Rechecks
from testbed import kubepods, podnet

PORT = 8080
SERVER = "echo"
"""The echo servers' names: SERVER-<node>, one per node, plain (no sidecar)."""
FIRST_CONNECT_S = 15.0
"""How long after a pod is seen Running its app may take to get an answer (Envoy starts, the
app connects every 0.5 s): past it, the pod is judged on its rules alone."""
RECHECK_S = 1.0
"""How often an undecided pod's log is read again."""
_ANSWER = re.compile(r" peer=(\S+) .* from=(\S+)$")


def answer(line: str) -> tuple[str, str] | None:
    """(the address the server saw, the app's own) of an answered `connect` line; None for a
    refused or failed one."""
    if "connect " not in line:
        return None
    found = _ANSWER.search(line.rstrip())
    return None if found is None else (found[1], found[2])


def _host(address: str) -> str:
    return address.rsplit(":", 1)[0].strip("[]")


def verdict(
    log: Iterable[str], *, pod_ip: str, rules: Callable[[], bool], waited: float
) -> bool | None:
    """Did the pod run captured from its first instant? `log`: its app's lines so far;
    `rules`: are Istio's rules in its netns (asked only when no answer decides); `waited`:
    seconds since it was seen Running. None: cannot tell yet."""
    answers = [a for a in map(answer, log) if a is not None]
    if any(peer == mine for peer, mine in answers):
        return False  # the server saw the app's own socket: nothing in the pod took it
    # A proxy in the pod answered in the server's stead: the server saw the pod's address
    # (no NAT between pods of one node) from a port that is not the app's.
    if any(_host(peer) == pod_ip and _host(mine) == pod_ip for peer, mine in answers):
        return True
    if waited < FIRST_CONNECT_S:
        return None
    return rules()


class SidecarCheck:
    """The churn's `captured` for sidecar pods (the API's Running pod -> bool | None)."""

    def __init__(
        self,
        core: Any,
        namespace: str,
        netns: Callable[[str], str],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.core, self.namespace, self.netns = core, namespace, netns
        self._rechecks = Rechecks(RECHECK_S, clock)
        self.through_proxy = 0
        """Pods proven captured by an answer through their proxy (the rest: by rules)."""

    def __call__(self, item: Any) -> bool | None:
        uid = item.metadata.uid
        waited = self._rechecks.due(uid)
        if waited is None:
            return None
        log = kubepods.logs(self.core, self.namespace, item.metadata.name, "app").splitlines()
        by_rules: list[bool] = []

        def rules() -> bool:
            by_rules.append(podnet.has_istio_rules(self.netns(uid)))
            return by_rules[-1]

        found = verdict(log, pod_ip=item.status.pod_ip or "", rules=rules, waited=waited)
        if found is not None:
            if found and not by_rules:
                self.through_proxy += 1
            self._rechecks.judged(uid)
        return found


class EchoServers:
    """The plain echo server of each node (SERVER-<node>), and the app command of a sidecar
    pod on that node: `connect-loop` to it every 0.5 s. A server's address is read again when
    a pod is created (a rebooted node makes the server's sandbox anew, with a new address)."""

    def __init__(self, core: Any, namespace: str, image: str, nodes: Iterable[str]) -> None:
        self.core, self.namespace, self.image = core, namespace, image
        self.nodes = list(nodes)
        self._ips: dict[str, str] = {}

    def start(self) -> None:
        for node in self.nodes:
            manifest = kubepods.pod_manifest(
                f"{SERVER}-{node}", self.image, app_command=["serve", str(PORT)], sidecar=False
            )
            manifest["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
            self.core.create_namespaced_pod(self.namespace, manifest)
        for node in self.nodes:
            view = kubepods.wait_running(self.core, self.namespace, f"{SERVER}-{node}")
            assert view.ip, view
            self._ips[node] = view.ip

    def command(self, node: str) -> list[str]:
        try:
            pod = self.core.read_namespaced_pod(f"{SERVER}-{node}", self.namespace)
            if pod.status.pod_ip:
                self._ips[node] = pod.status.pod_ip
        except Exception:  # the API away: the last address known (the create fails as well)
            pass
        return ["connect-loop", self._ips[node], str(PORT), "0.5"]
