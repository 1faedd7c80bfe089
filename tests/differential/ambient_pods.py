"""Seeded random ambient pods, and the ZDS stream an agent sent ztunnel about them made
comparable between two runs: for tests/node/test_istio_node_agent.py, which runs Istio's node
agent and ours on the same pods against the ztunnel double (testbed/ztunnel_double.py).

The pods cover what decides whether and how ztunnel gets a pod: the namespace's label (ambient or
none), the pod's own label (opted out, or opted in inside an unlabelled namespace), its service
account (ztunnel issues identity by namespace and service account), waypoints, sidecar-injected
pods (never enrolled), host-network pods, pods that complete (restartPolicy Never) and pods kept
terminating (they ignore SIGTERM under a long grace period).

`normalized` turns a stretch of the stream into lines: pod uids become namespace/name (the uids
differ between the runs), namespace names their key, descriptors their count and whether the
netns was the pod's own; a snapshot (hello to SnapshotSent) is sorted by pod, as Istio's comes
from a map in random order; after it, each pod's messages keep their order, but pods are listed
by name (pods created together reach the agents in any order).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from testbed.ztunnel_double import Message

AMBIENT = {"istio.io/dataplane-mode": "ambient"}
NAMESPACES: dict[str, dict[str, str]] = {
    # key: namespace labels
    "mesh-a": AMBIENT,
    "mesh-b": AMBIENT,
    "plain": {},
}
SERVICE_ACCOUNTS = ("default", "reviews", "ratings", "payments")
KINDS = (
    "plain",
    "opted-out",
    "opted-in",  # the pod's own ambient label (counts in an unlabelled namespace)
    "waypoint",
    "sidecar",
    "host-network",
    "completed",
    "terminating",
    "bypass-inbound",
)
WAYPOINT = {"gateway.istio.io/managed": "istio.io-mesh-controller"}
SIDECAR_STATUS = '{"containers":["istio-proxy"],"initContainers":null}'
TERMINATING_GRACE = 600
"""Seconds: the terminating pods outlast every fault; the test ends them with grace 0."""


@dataclass(frozen=True)
class AmbientPod:
    name: str
    namespace: str
    """A key of NAMESPACES."""
    service_account: str
    kind: str


def random_pods(rng: random.Random, count: int) -> list[AmbientPod]:
    """`count` pods: every kind in every namespace first (as far as count allows), the rest
    drawn at random; each with a random service account."""
    combos = [(k, ns) for k in KINDS for ns in NAMESPACES]
    rng.shuffle(combos)
    picks = combos[:count]
    while len(picks) < count:
        picks.append((rng.choice(KINDS), rng.choice(list(NAMESPACES))))
    return [
        AmbientPod(f"p{i:02d}-{kind}", ns, rng.choice(SERVICE_ACCOUNTS), kind)
        for i, (kind, ns) in enumerate(picks)
    ]


def manifest(pod: AmbientPod, image: str, app: list[str], proxy: list[str]) -> dict[str, Any]:
    """The pod for the node: `app` (an argv of the workload image that keeps running) as its
    app container, and for sidecar pods `proxy` as istio-proxy with the injector's mark."""
    labels: dict[str, str] = {"app": pod.kind}
    annotations: dict[str, str] = {}
    containers: list[dict[str, Any]] = [{"name": "app", "command": app}]
    spec: dict[str, Any] = {
        "serviceAccountName": pod.service_account,
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 1,
    }
    if pod.kind == "opted-out":
        labels["istio.io/dataplane-mode"] = "none"
    elif pod.kind == "opted-in":
        labels.update(AMBIENT)
    elif pod.kind == "waypoint":
        labels.update(WAYPOINT)
    elif pod.kind == "sidecar":
        annotations["sidecar.istio.io/status"] = SIDECAR_STATUS
        containers.append({"name": "istio-proxy", "command": proxy, "uid": 1337})
    elif pod.kind == "host-network":
        spec["hostNetwork"] = True
    elif pod.kind == "completed":
        spec["restartPolicy"] = "Never"
        containers[0]["command"] = ["/bin/true"]
    elif pod.kind == "terminating":
        containers[0]["command"] = ["/bin/sh", "-c", "trap '' TERM; while :; do sleep 1; done"]
        spec["terminationGracePeriodSeconds"] = TERMINATING_GRACE
    elif pod.kind == "bypass-inbound":
        annotations["ambient.istio.io/bypass-inbound-capture"] = "true"
    spec["containers"] = [_container(c, image) for c in containers]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod.name, "labels": labels, "annotations": annotations},
        "spec": spec,
    }


def _container(c: dict[str, Any], image: str) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": c["name"],
        "image": image,
        "imagePullPolicy": "Never",
        "command": c["command"],
    }
    if "uid" in c:
        out["securityContext"] = {"runAsUser": c["uid"], "runAsGroup": c["uid"]}
    return out


def normalized(
    stream: list[Message],
    pod_of: Mapping[str, str],
    namespace_key: Mapping[str, str],
    netns_owner: Callable[[str], str | None],
) -> list[str]:
    """The stream's lines (module doc). `pod_of`: uid -> namespace/name as the test knew the
    pods; `namespace_key`: namespace name -> key; `netns_owner`: netns (Message.netns) -> uid of
    the pod whose sandbox it was, None if none."""

    def pod(uid: str) -> str:
        if uid not in pod_of:
            return f"unknown pod {uid}"
        namespace, name = pod_of[uid].split("/", 1)
        return f"{namespace_key.get(namespace, namespace)}/{name}"

    def line(m: Message) -> str:
        text = f"{m.kind} {pod(m.uid)}" if m.uid else m.kind
        if m.info is not None:
            name, namespace, account = m.info
            text += f" info=({name}, {namespace_key.get(namespace, namespace)}, sa={account})"
        if m.fds:
            owner = netns_owner(m.netns) if m.netns else None
            whose = "own" if owner == m.uid else f"not its own ({m.netns or m.netns_inode})"
            text += f" fds={m.fds} netns={whose}"
        return text

    lines: list[str] = []
    snapshot: list[str] | None = None
    live: dict[str, list[str]] = {}
    for m in stream:
        if m.kind == "hello":
            lines += _flush(live)
            lines.append("hello")
            snapshot = []
        elif snapshot is not None and m.kind != "snapshot_sent":
            snapshot.append("  " + line(m))
        elif m.kind == "snapshot_sent":
            lines += sorted(snapshot or [], key=_by_pod)
            lines.append("snapshot_sent")
            snapshot = None
        else:
            seen = live.setdefault(pod(m.uid), [])
            text = "  " + line(m)
            # A second DelWorkload for the same pod, with nothing in between, says so.
            seen.append(f"{text} (again)" if m.kind == "del" and text in seen[-1:] else text)
    lines += sorted(
        snapshot or [], key=_by_pod
    )  # a snapshot cut off (the agent or ztunnel went away)
    return lines + _flush(live)


def _by_pod(line: str) -> tuple[str, str]:
    """A snapshot's lines by pod (then kind): one agent's add pairs with the other's keep."""
    kind, pod = line.split()[:2]
    return pod, kind


def _flush(live: dict[str, list[str]]) -> list[str]:
    out = [line for name in sorted(live) for line in live[name]]
    live.clear()
    return out
