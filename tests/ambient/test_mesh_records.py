"""The mesh keeps nothing of a pod once the pod is deleted, whichever way it went: the real
MeshDataplane fed by the real AmbientWatch (named fakes of the rules, ztunnel and API parts, as in
test_mesh.py), each path run for many pods, its per-pod records counted afterwards."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent.ambient.mesh import MeshDataplane
from agent.ambient.watch import AmbientWatch
from agent.label_selectors import DEFAULT_ENABLEMENT_SELECTORS
from tests.ambient.fakes import namespace, pod
from tests.ambient.test_mesh import Parts
from tests.ambient.test_mesh_watch import AMBIENT, ENABLED, FakeStore

PODS = 50
REFUSED = {"ambient.istio.io/bypass-inbound-capture": "yes please"}
OPTED_OUT = {"istio.io/dataplane-mode": "none"}


class Bed:
    def __init__(self, tmp_path: Path) -> None:
        self.parts = Parts(tmp_path)
        self.mesh: MeshDataplane = self.parts.mesh
        self.store = FakeStore()
        self.store.namespaces["app"] = namespace(labels=AMBIENT)
        self.store.namespaces["plain"] = namespace("plain")
        self.watch = AmbientWatch(
            pods=self.store,
            namespaces=self.store,
            mesh=self.mesh,
            selectors=DEFAULT_ENABLEMENT_SELECTORS,
            exclude_namespaces=["kube-system"],
            system_namespace="istio-system",
        )

    def pod(self, i: int, ns: str = "app", **kw: Any) -> dict[str, Any]:
        return self.store.put(pod(f"web-{i}", namespace=ns, uid=f"uid-{i}", **kw))

    def update(self, old: dict[str, Any], new: dict[str, Any]) -> None:
        self.watch.on_pod("update", old, new)
        self.drain()

    def delete(self, last: dict[str, Any]) -> None:
        meta = last["metadata"]
        del self.store.pods[(meta["namespace"], meta["name"])]
        self.watch.on_pod("delete", last, None)
        self.drain()

    def drain(self) -> None:
        while (taken := self.watch.next_item()) is not None:
            self.watch.step(taken)

    def kept(self) -> dict[str, int]:
        """The mesh's per-pod records (none of them may outlive a deleted pod)."""
        m = self.mesh
        return {
            "enrolled": len(m.snapshot()),
            "locks": len(m._pod_locks),
            "refusals": len(m._refusals),
            "released by DEL": len(m._released_by_del),
            "first tries": len(m._first_try),
        }


NOTHING = {"enrolled": 0, "locks": 0, "refusals": 0, "released by DEL": 0, "first tries": 0}


def test_a_pod_annotated_by_the_watch_but_never_enrolled_leaves_no_lock(tmp_path: Path) -> None:
    """A pod outside ambient whose annotation claims `enabled` (written by an earlier agent):
    the watch corrects the annotation, and its delete event releases nothing."""
    bed = Bed(tmp_path)
    for i in range(PODS):
        p = bed.pod(i, "plain", annotations=ENABLED)
        bed.update(p, p)
        bed.delete(p)
    assert bed.parts.annotator.values == {f"plain/web-{i}": None for i in range(PODS)}
    assert bed.kept() == NOTHING


def test_a_pod_released_by_its_del_and_deleted_with_its_namespace_leaves_no_record(
    tmp_path: Path,
) -> None:
    """CNI ADD, CNI DEL (DelWorkload sent), then the delete event after the namespace has left
    the cache: nothing matches, nothing is released again, and nothing is kept."""
    bed = Bed(tmp_path)
    for i in range(PODS):
        ns = f"gone-{i}"
        bed.store.namespaces[ns] = namespace(ns, labels=AMBIENT)
        p, sandbox = bed.pod(i, ns), f"sandbox-{i}"
        bed.mesh.add(p, str(bed.parts.netns), sandbox=sandbox)
        bed.mesh.remove(p, deleted=True, sandbox=sandbox)
        del bed.store.namespaces[ns]
        bed.delete(p)
    removes = [e for e in bed.parts.journal if e[0] == "ztunnel.remove"]
    assert len(removes) == PODS  # one DelWorkload a pod: the DEL's
    assert bed.kept() == NOTHING


def test_a_running_pod_with_a_refused_value_that_opts_out_leaves_no_record(
    tmp_path: Path,
) -> None:
    """Enrolled with the node-wide options (its own value refused), opted out (released, not
    deleted), then deleted: its delete event matches nothing and releases nothing."""
    bed = Bed(tmp_path)
    for i in range(PODS):
        bed.parts.finder.by_uid[f"uid-{i}"] = str(bed.parts.netns)
        p = bed.pod(i, annotations=REFUSED)
        bed.update(p, p)
        assert bed.mesh.state(f"uid-{i}") == "enabled"
        out = bed.pod(i, labels=OPTED_OUT, annotations={**REFUSED, **ENABLED})
        bed.update(p, out)
        assert bed.mesh.state(f"uid-{i}") == "none"
        bed.delete(out)
    assert bed.kept() == NOTHING


def test_the_cni_path_and_the_watch_path_leave_no_record(tmp_path: Path) -> None:
    """The common paths, for contrast: CNI ADD + DEL + delete event, and the watch enrolling a
    running pod that is then deleted."""
    bed = Bed(tmp_path)
    for i in range(PODS):
        p, sandbox = bed.pod(i), f"sandbox-{i}"
        bed.mesh.add(p, str(bed.parts.netns), sandbox=sandbox)
        bed.mesh.remove(p, deleted=True, sandbox=sandbox)
        bed.delete(p)
    for i in range(PODS, 2 * PODS):
        bed.parts.finder.by_uid[f"uid-{i}"] = str(bed.parts.netns)
        p = bed.pod(i)
        bed.update(p, p)
        bed.delete(p)
    assert bed.kept() == NOTHING
