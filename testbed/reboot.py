"""A node reboot on the real node (testbed/realnode.py), on containerd (1.6 or 2): the fault
`node_reboot`.

    node_reboot(cluster, core, agent_image=..., at_boot=...)
      the agent's image off the runtime's store (its pod then cannot start at boot)
      every process of the node killed at once: kubelet, the runtime (SIGKILL), every container
        and its shim (the agent's among them)
      what a reboot empties emptied: the runtime's state and runc's root (/run/containerd,
        /run/runc), the pods' netns files (unmounted: the namespaces are gone), the node's run
        dirs (/var/run/istio-cni, the ZDS socket's dir, a layout's /run dirs), and the tmpfs
        volumes below kubelet's root (unmounted; their dirs stay, as on disk)
      at_boot()                    what else the boot does to the node's files (a primary CNI
                                   rewriting its conflist, a plugin binary gone)
      the runtime, then kubelet start again; kubelet recreates every pod of the node
      once a pod of the node other than the agent's gets its sandbox made anew (the node's
        kubelet's SandboxChanged Event), the agent's image arrives and the node's waiting agent
        pod is replaced at once (no back-off)

The control plane and the node's own network namespace stay: only the node's processes and
its volatile state go. On several nodes (testbed/nodes.py) only the rebooted node's Events and
agent pod count: the others go on as they were.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import urllib3
from kubernetes.client.exceptions import ApiException

from testbed import nodeclean
from testbed.crio import Crio
from testbed.images import Image
from testbed.realnode import RealCluster
from testbed.wait import wait_for

AGENT_NAMESPACE = "kube-system"
AGENT_SELECTOR = "app.kubernetes.io/name=istio-cni"
RECREATING_TIMEOUT = 90.0

# Run inside the node's mount namespace: unmount (lazily, deepest first) everything below each
# dir, then remove what is in it; with "--keep" only unmount.
_EMPTY = """
import os, shutil, subprocess, sys
keep = sys.argv[1] == "--keep"
for d in sys.argv[2:]:
    d = os.path.realpath(d)  # mountinfo names the real path (/var/run is a link to /run)
    points = []
    for line in open("/proc/self/mountinfo"):
        p = line.split()[4].replace("\\\\040", " ")
        if p.startswith(d + "/"):
            points.append(p)
    for p in sorted(set(points), key=lambda p: p.count("/"), reverse=True):
        subprocess.run(["umount", "-l", p], capture_output=True)
    if keep or not os.path.isdir(d):
        continue
    for name in os.listdir(d):
        path = os.path.join(d, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)
"""


@dataclass(frozen=True)
class RebootTimes:
    """Wall-clock times (time.time()) of the reboot's steps."""

    killed: float
    kubelet_started: float
    recreating: float | None
    """kubelet's first SandboxChanged Event of a pod other than the agent's, after its start."""
    agent_image_back: float | None


def node_reboot(
    cluster: RealCluster,
    core: Any,
    *,
    agent_image: Image | None = None,
    at_boot: Callable[[], None] | None = None,
    run_dirs: tuple[Path, ...] = (),
) -> RebootTimes:
    """Reboot the node (see the module's doc); returns once the agent's image is back (with
    `agent_image`) or kubelet runs. `run_dirs`: more node paths a reboot empties."""
    assert cluster.kubelet is not None and cluster.record is not None
    runtime = cluster.cri
    if isinstance(runtime, Crio):
        raise NotImplementedError("node_reboot: CRI-O's volatile state is not emptied here")
    if agent_image is not None:
        runtime.remove_image(agent_image.ref)
    killed = time.time()
    for daemon in (cluster.kubelet.daemon, runtime.daemon):
        if daemon is not None and daemon.pid is not None:
            _killpg(daemon.pid)
    nodeclean.kill_containers(cluster.record)
    cluster.kubelet.stop()  # reaps what was killed
    runtime.stop()
    try:
        _in_node(cluster, "--empty", volatile_dirs(cluster, run_dirs))
        _in_node(cluster, "--keep", [cluster.kubelet_dirs.root])
        if at_boot is not None:
            at_boot()
    finally:  # the node runs again, whatever failed: the caller's clean-up needs it
        runtime.start()
        cluster.kubelet.start()
    kubelet_started = time.time()
    if agent_image is None:
        return RebootTimes(killed, kubelet_started, None, None)
    node = cluster.node_name
    try:
        recreating = wait_for(
            lambda: _answered(lambda: _sandbox_changed_since(core, node, kubelet_started)),
            "kubelet recreating a pod's sandbox after the reboot",
            RECREATING_TIMEOUT,
            interval=0.5,
        )
    finally:  # whatever the wait saw, the node gets the agent's image back
        if isinstance(runtime, Crio):  # pragma: no cover - refused above
            runtime.import_images([agent_image])
        else:
            runtime.import_image(agent_image.archive)
    back = time.time()
    wait_for(
        lambda: _answered(lambda: _replace_agent_pod(core, node)),
        f"{node}'s waiting agent pod replaced",
        RECREATING_TIMEOUT,
        interval=0.5,
    )
    return RebootTimes(killed, kubelet_started, recreating, back)


def volatile_dirs(cluster: RealCluster, extra: tuple[Path, ...] = ()) -> list[Path]:
    """Node paths (as the node's processes see them) on a tmpfs at boot: the runtime's state,
    runc's root, the pods' netns dir, the node's run dirs."""
    runtime = cluster.cri
    assert not isinstance(runtime, Crio)
    dirs = [runtime.dirs.state, runtime.dirs.runc_root, cluster.base / "run", *extra]
    platform = cluster.platform
    if platform is not None:
        dirs += [
            Path(p)
            for p in platform.node_paths()
            if p.startswith(("/run/", "/var/run/")) and p != platform.bin_dir
        ]
    return dirs


def _in_node(cluster: RealCluster, how: str, dirs: list[Path]) -> None:
    assert cluster.kubelet is not None
    argv = [*cluster.kubelet.prefix, sys.executable, "-c", _EMPTY, how, *map(str, dirs)]
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"emptying {dirs} in the node failed: {done.stderr.strip()[-2000:]}")


def _killpg(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def _answered(ask: Callable[[], float | bool | None]) -> float | bool | None:
    """`ask()`, or None while the API server does not answer (stopped, or etcd restarting)."""
    try:
        return ask()
    except (ApiException, urllib3.exceptions.HTTPError, OSError):
        return None


def _replace_agent_pod(core: Any, node: str) -> bool:
    """The node's agent pods deleted at once: the DaemonSet makes another, which starts with
    the image there (the old one waits out kubelet's back-off on the missing image)."""
    agents = core.list_namespaced_pod(
        AGENT_NAMESPACE, label_selector=AGENT_SELECTOR, field_selector=f"spec.nodeName={node}"
    )
    for pod in agents.items:
        with contextlib.suppress(ApiException):  # already gone
            core.delete_namespaced_pod(pod.metadata.name, AGENT_NAMESPACE, grace_period_seconds=0)
    return True


RECREATING = {"SandboxChanged", "FailedCreatePodSandBox", "Pulled", "Created", "Started"}
"""kubelet's Events of a pod it starts: the first (SandboxChanged) when the runtime still knows
the old sandbox, the others whatever it knows."""


def _sandbox_changed_since(core: Any, node: str, since: float) -> float | None:
    """When `node`'s kubelet said it (re)creates a pod outside the agent's namespace, at or
    after `since` (Events have a second's resolution), or None yet. Another node's kubelet
    starting its pods meanwhile says nothing of this node's."""
    for event in core.list_event_for_all_namespaces().items:
        if event.involved_object.namespace == AGENT_NAMESPACE or event.reason not in RECREATING:
            continue
        if event.source is None or event.source.host != node:
            continue
        when = event.last_timestamp or event.event_time or event.first_timestamp
        if when is not None and when.timestamp() >= int(since):
            return time.time()
    return None
