"""Several real nodes on one control plane: each a RealCluster (kubelet + containerd in a network
namespace of its own, laid out as one platform from its start, so the chart's DaemonSet finds
the same node paths on every node), joined by the fabric (testbed/fabric.py), which routes every
node's pod subnet to the others.

    nodes = Nodes(workdir, count=3); nodes.start()
    nodes.add(register_taints=(...,))  a node joining later
    nodes.remove(node)                 drained (cordoned, its pods evicted), stopped, deleted
    nodes.stop()                       every node, the control plane with the first, the fabric

The first node holds the control plane (its API server listens on that node's link); the others
reach it over their own links. It is therefore never removed.
"""

from __future__ import annotations

import contextlib
import secrets
from pathlib import Path
from typing import Any

from kubernetes.client.exceptions import ApiException

from testbed import kubepods
from testbed.controlplane import NODE_CONTROLLERS
from testbed.fabric import Fabric
from testbed.platforms import PLATFORMS, Platform
from testbed.realnode import RealCluster

LAYOUT = PLATFORMS["kind"]
"""kind's node: kindnet's ptp conflist, real ptp/host-local/portmap, routes between nodes."""
CONTROLLERS = NODE_CONTROLLERS + ",podgc"
"""podgc: a deleted Node's pods are deleted, as in any cluster."""
EVICT_TIMEOUT = 90.0


class Nodes:
    def __init__(self, workdir: Path, count: int = 3, *, layout: Platform = LAYOUT) -> None:
        self.workdir = workdir
        self.count = count
        self.layout = layout
        self.fabric = Fabric()
        self.members: list[RealCluster] = []
        """Nodes started and not removed, the first one first."""
        self._made = 0
        # One /16 for the cluster's pods, a /24 per node, as kind's podSubnet and node CIDRs.
        self._pod_prefix = f"10.{secrets.randbelow(40) + 200}"

    @property
    def first(self) -> RealCluster:
        return self.members[0]

    @property
    def kubeconfig(self) -> Path:
        return self.first.kubeconfig

    def core(self) -> Any:
        return self.first.core()

    def start(self) -> None:
        for _ in range(self.count):
            self.add()

    def add(self, register_taints: tuple[str, ...] = ()) -> RealCluster:
        """Start one more node on the cluster's control plane and join it to the fabric; returns
        once its Node is Ready."""
        self._made += 1
        index = self._made
        node = RealCluster(
            self.workdir / f"node-{index}",
            node_name=f"tb-node-{index}",
            plane=self.first.plane if self.members else None,
            controllers=CONTROLLERS,
            layout=self.layout,
            register_taints=register_taints,
            pod_subnet=f"{self._pod_prefix}.{index}.0/24",
        )
        self.members.append(node)  # stop() covers a start that failed half-way
        node.start()
        if node is self.first:
            # The first node's record holds the fabric: a session killed before its teardown
            # has it removed with the node by the next one's sweep (nodeclean.sweep_stale).
            assert node.record is not None
            node.record.extra_netns.append(self.fabric.netns_name)
            node.record.save()
            self.fabric.create()
        self.fabric.join(node.network.netns_name, node.pod_subnet)
        return node

    def node(self, name: str) -> RealCluster:
        for node in self.members:
            if node.node_name == name:
                return node
        raise KeyError(f"no node {name} among {[n.node_name for n in self.members]}")

    def pod_netns(self, pod_uid: str) -> str:
        """/proc/<pid>/ns/net of the pod's sandbox, on whichever node runs it."""
        for node in self.members:
            pid = node.cri.sandbox_pid(pod_uid)
            if pid is not None:
                return f"/proc/{pid}/ns/net"
        raise AssertionError(f"no running sandbox of pod {pod_uid} on any node")

    def remove(self, node: RealCluster) -> None:
        """`kubectl drain` then the machine gone and `kubectl delete node`: cordoned, every pod
        but the DaemonSets' evicted (deleted with its grace period, waited away), kubelet and
        containerd stopped with the node's containers, the Node deleted."""
        if node is self.first:
            raise ValueError("the first node holds the control plane: remove another one")
        core = self.core()
        core.patch_node(node.node_name, {"spec": {"unschedulable": True}})
        selector = f"spec.nodeName={node.node_name}"
        evicted = []
        for pod in core.list_pod_for_all_namespaces(field_selector=selector).items:
            owners = pod.metadata.owner_references or []
            if any(o.kind == "DaemonSet" for o in owners):
                continue
            with contextlib.suppress(ApiException):
                core.delete_namespaced_pod(pod.metadata.name, pod.metadata.namespace)
            evicted.append((pod.metadata.namespace, pod.metadata.name, pod.metadata.uid))

        def gone() -> bool:
            left = {p.metadata.uid for p in core.list_pod_for_all_namespaces().items}
            return not any(uid in left for _, _, uid in evicted)

        kubepods.wait_for(gone, f"the pods of {node.node_name} evicted", EVICT_TIMEOUT)
        self.members.remove(node)
        self.fabric.leave(node.network.netns_name)
        node.stop()
        core.delete_node(node.node_name)

    def stop(self) -> None:
        """Every node (the first, with the control plane, last), then the fabric; raises
        naming what failed after trying all."""
        errors = []
        for node in reversed(self.members):
            try:
                node.stop()
            except Exception as e:
                errors.append(f"{node.node_name}: {e}")
        self.members = []
        try:
            self.fabric.delete()
        except Exception as e:
            errors.append(f"fabric: {e}")
        if errors:
            raise RuntimeError("nodes cleanup: " + "; ".join(errors))
