"""The ambient pod generator and the ZDS stream normalization of the node differential."""

from __future__ import annotations

import random

from testbed.ztunnel_double import Message
from tests.differential.ambient_pods import KINDS, NAMESPACES, manifest, normalized, random_pods


def test_the_pods_cover_every_kind_in_every_namespace_and_replay_from_their_seed() -> None:
    pods = random_pods(random.Random(7), 32)
    assert len({p.name for p in pods}) == 32
    # 27 kinds-by-namespace combinations: each once, then 5 drawn at random.
    assert len({(p.kind, p.namespace) for p in pods}) == len(KINDS) * len(NAMESPACES)
    assert {p.kind for p in pods} == set(KINDS)
    assert {p.namespace for p in pods} == set(NAMESPACES)
    assert len({p.service_account for p in pods}) > 1
    assert random_pods(random.Random(7), 32) == pods


def test_a_pods_manifest_carries_what_decides_its_enrolment() -> None:
    by_kind = {p.kind: p for p in random_pods(random.Random(1), 40)}
    done = manifest(by_kind["completed"], "img", ["app"], ["proxy"])
    assert done["spec"]["restartPolicy"] == "Never"
    assert done["spec"]["serviceAccountName"] == by_kind["completed"].service_account
    sidecar = manifest(by_kind["sidecar"], "img", ["app"], ["proxy"])
    assert "sidecar.istio.io/status" in sidecar["metadata"]["annotations"]
    assert [c["name"] for c in sidecar["spec"]["containers"]] == ["app", "istio-proxy"]
    opted_out = manifest(by_kind["opted-out"], "img", ["app"], ["proxy"])
    assert opted_out["metadata"]["labels"]["istio.io/dataplane-mode"] == "none"
    assert manifest(by_kind["host-network"], "img", ["app"], ["proxy"])["spec"]["hostNetwork"]


def test_streams_that_differ_only_in_uids_and_order_normalize_the_same() -> None:
    def stream(uid_a: str, uid_b: str, netns_a: str, first_a: bool) -> list[str]:
        a = Message(1, "add", uid_a, ("a", "ns-x", "reviews"), 1, 5, netns_a)
        b = Message(1, "add", uid_b, ("b", "ns-x", "default"), 1, 6, "cni-b")
        snapshot = [a, b] if first_a else [b, a]
        live = [Message(1, "del", uid_b), Message(1, "del", uid_a)]
        if not first_a:
            live.reverse()
        messages = [Message(1, "hello"), *snapshot, Message(1, "snapshot_sent"), *live]
        owners = {netns_a: uid_a, "cni-b": uid_b}
        pods = {uid_a: "ns-x/a", uid_b: "ns-x/b"}
        return normalized(messages, pods, {"ns-x": "mesh-a"}, owners.get)

    one = stream("u1", "u2", "cni-a", True)
    assert one == stream("v1", "v2", "cni-a", False)
    assert one == [
        "hello",
        "  add mesh-a/a info=(a, mesh-a, sa=reviews) fds=1 netns=own",
        "  add mesh-a/b info=(b, mesh-a, sa=default) fds=1 netns=own",
        "snapshot_sent",
        "  del mesh-a/a",
        "  del mesh-a/b",
    ]
    # Another pod's namespace is a difference.
    assert "netns=not its own (cni-b)" in stream("u1", "u2", "cni-b", True)[1]


def test_a_repeated_del_is_marked() -> None:
    messages = [Message(1, "del", "u1"), Message(1, "del", "u1"), Message(1, "del", "u2")]
    lines = normalized(messages, {"u1": "n/a", "u2": "n/b"}, {}, lambda _: None)
    assert lines == ["  del n/a", "  del n/a (again)", "  del n/b"]
