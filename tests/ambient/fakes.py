"""Named fakes of the ambient parts' protocols (agent.ambient.dataplane) for unit tests of the
order, rollback and decisions around them. They record every call in one shared journal."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from typing import Any

from agent.ambient.dataplane import AmbientPod, SnapshotSource
from agent.ambient.enrollment import AnnotationPatch
from agent.errors import RedirectError, ZtunnelError, ZtunnelNotConnected
from agent.rules.ambient.options import PodRuleOptions

Journal = list[tuple[str, ...]]


class FakePodRules:
    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.fail_apply = False
        self.fail_remove = False
        self.programmed: dict[str, PodRuleOptions] = {}

    def apply(self, netns_path: str, options: PodRuleOptions) -> str:
        self.journal.append(("rules.apply", netns_path))
        if self.fail_apply:
            raise RedirectError(f"iptables-restore in {netns_path}: exit 1")
        self.programmed[netns_path] = options
        return "fake"

    def remove(self, netns_path: str) -> None:
        self.journal.append(("rules.remove", netns_path))
        if self.fail_remove:
            raise RedirectError("iptables in netns: exit 1")
        self.programmed.pop(netns_path, None)

    def present(self, netns_path: str, options: PodRuleOptions) -> bool:
        self.journal.append(("rules.present", netns_path))
        return self.programmed.get(netns_path) == options

    def installed(self, netns_path: str) -> bool:
        self.journal.append(("rules.installed", netns_path))
        return netns_path in self.programmed


class FakeHostProbeRules:
    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.entries: dict[str, set[str]] = {}
        self.fail_add = False
        self.fail_add_times = 0
        self.removed_all = False

    def ensure(self) -> None:
        self.journal.append(("host.ensure",))

    def add(self, uid: str, ips: Collection[str]) -> None:
        self.journal.append(("host.add", uid, *sorted(ips)))
        if self.fail_add_times:
            self.fail_add_times -= 1
            raise RedirectError("ipset add: exit 1")
        if self.fail_add:
            raise RedirectError("ipset add: exit 1")
        self.entries.setdefault(uid, set()).update(ips)

    def remove(self, uid: str, ips: Collection[str]) -> None:
        """Only the given IPs (the real set deletes entries by IP and the pod's UID)."""
        self.journal.append(("host.remove", uid))
        left = self.entries.get(uid, set()) - set(ips)
        if left:
            self.entries[uid] = left
        else:
            self.entries.pop(uid, None)

    def sync(self, pods: Iterable[tuple[str, Collection[str]]]) -> None:
        self.entries = {uid: set(ips) for uid, ips in pods}
        self.journal.append(("host.sync", *sorted(self.entries)))

    def remove_all(self) -> None:
        self.journal.append(("host.remove_all",))
        self.removed_all = True
        self.entries.clear()


class FakeZtunnelLink:
    """Connected by default; `connected = False` makes add raise ZtunnelNotConnected."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.connected = True
        self.refuse = False
        self.listening = False
        self.workloads: dict[str, AmbientPod] = {}
        self.source: SnapshotSource | None = None

    def start(self) -> None:
        self.listening = True

    def stop(self) -> None:
        self.listening = False

    def ready(self) -> bool:
        return self.listening

    def add(self, pod: AmbientPod) -> None:
        self.journal.append(("ztunnel.add", pod.uid))
        if not self.connected:
            raise ZtunnelNotConnected("no ztunnel connection")
        if self.refuse:
            raise ZtunnelError("ztunnel ack error: netns gone")
        self.workloads[pod.uid] = pod

    def remove(self, uid: str) -> None:
        self.journal.append(("ztunnel.remove", uid))
        self.workloads.pop(uid, None)

    def set_snapshot_source(self, source: SnapshotSource) -> None:
        self.source = source

    def reconnect(self) -> list[AmbientPod]:
        """What a fresh ztunnel connection gets: the snapshot."""
        assert self.source is not None
        self.connected = True
        self.workloads = {p.uid: p for p in self.source()}
        return list(self.workloads.values())


class FakeAnnotator:
    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.values: dict[str, str | None] = {}
        self.fail = False
        self.fail_times = 0
        """Fail this many patches (then succeed), as an API server briefly away."""

    def patch(self, namespace: str, name: str, patch: AnnotationPatch) -> None:
        value = patch.body["metadata"]["annotations"]["ambient.istio.io/redirection"]
        self.journal.append(("annotate", f"{namespace}/{name}", str(value)))
        if self.fail_times:
            self.fail_times -= 1
            raise RuntimeError("API server answered 503")
        if self.fail:
            raise RuntimeError("API server answered 500")
        self.values[f"{namespace}/{name}"] = value


class FakeNetnsFinder:
    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.by_uid: dict[str, str] = {}

    def __call__(self, pods: Sequence[Any]) -> dict[str, str]:
        self.journal.append(("find_netns", *(p["metadata"]["uid"] for p in pods)))
        return {
            p["metadata"]["uid"]: self.by_uid[p["metadata"]["uid"]]
            for p in pods
            if p["metadata"]["uid"] in self.by_uid
        }


def pod(
    name: str = "web-0",
    *,
    namespace: str = "app",
    uid: str = "uid-1",
    ips: Sequence[str] = ("10.0.0.5",),
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    phase: str = "Running",
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid,
            "labels": dict(labels or {}),
            "annotations": dict(annotations or {}),
            "resourceVersion": "1",
        },
        "spec": {"serviceAccountName": "web", "containers": [{"name": "app"}]},
        "status": {
            "phase": phase,
            "podIPs": [{"ip": ip} for ip in ips],
            **({"podIP": ips[0]} if ips else {}),
        },
    }


def namespace(name: str = "app", labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": dict(labels or {}), "resourceVersion": "1"},
    }
