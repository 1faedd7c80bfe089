"""The soak's bed on the project's three-node test bed (testbed/nodes.py): kind's layout on
every node, the chart installed with kind's preset and ambient enabled, pods churned over the
nodes in a sidecar namespace (testbed/churn.py; a real Envoy as each pod's istio-proxy and its
app calling its node's echo server from its first instant, bench/soak/sidecar.py: an answer
through Envoy proves it captured, one on the app's own socket that it escaped) and in an ambient
one (bench/soak/ambient.py: each pod's first
connections captured, the pod enrolled), the agents reaching the API server through the fault
proxy (testbed/apifaults.py), their processes sampled from /proc, each node's files read, and at
the end each node compared with what it held before the churn began.

Each node's layout gives the ZDS socket's dir (ambient.ZDS_DIR, the chart's default) a dir of its
own, so each node's agent serves its own socket, and a ztunnel stand-in of this process is
connected to each (ambient.NodeZtunnel); `ztunnel_restart` restarts one. An ambient pod lives
on each node for the whole run (RESIDENT), so a restarted stand-in's snapshot holds a pod.

What this bed cannot do yet is returned by `lacks()` and named by the CLI (nothing today, beyond
what the catalogue declares unavailable).

`node_reboot` hard-reboots a node other than the first (which holds the control plane:
`targets()` keeps the scheduler off it) with testbed/reboot.py, its conflist and plugin kept.

Each node's conf dir is a small tmpfs of its own (CONF_TMPFS_SIZE), mounted in the node's mount
namespace before the chart is installed, so that `conf_dir_full` fills that file system and not
the machine's disk; the bed reads the conf dir as the node sees it (through its namespace's
/proc/PID/root).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from bench.soak import actions, ambient, procstats, sidecar
from bench.soak.bed import BedUnavailable, FilesState, PodEvent
from bench.soak.faults import Fault, FaultKind
from bench.soak.procstats import AgentSample
from testbed import chart as agent_mod
from testbed import images, kubepods
from testbed.apifaults import ApiFaultProxy
from testbed.apifaults import Fault as ProxyFault
from testbed.churn import Churn
from testbed.controlplane import SERVICE_IP
from testbed.helm import Helm
from testbed.nodenet import iptables
from testbed.nodes import LAYOUT, Nodes
from testbed.parts import MissingPartError, helm_binaries
from testbed.realnode import RealCluster
from testbed.reboot import node_reboot

log = logging.getLogger(__name__)

PRESET = Path(__file__).resolve().parents[2] / "values-examples" / "kind.yaml"
NODE_COUNT = 3
ROLLOUT_TIMEOUT = 300.0
UNINSTALLED = re.compile(r'msg(=uninstalled(\s|$)|="uninstalled"|":"uninstalled")')
"""The agent's log line when it removed what it installed (agent/lifecycle.py), logfmt or JSON."""
SETTLE_S = 60.0
"""How long the pods created last may take to run once the churn stops (then they are the
report's: stuck), and how long the nodes may take to clean up after the churn's pods (kubelet
removes a deleted pod's cgroups on its housekeeping) before what is left is a leftover."""
API_WAIT_S = 120.0
"""How long a Helm operation of the catalogue waits for the API server to answer (another fault
may have stopped it), as an operator would retry, before it fails."""
PROXY_FAULTS = {
    "silence": ProxyFault("silence"),
    "429": ProxyFault("status", code=429, retry_after=5),
    "401": ProxyFault("status", code=401),
}
LACKS: dict[str, str] = {}
SOAK_LAYOUT = replace(LAYOUT, extra_dirs=(*LAYOUT.extra_dirs, ambient.ZDS_DIR))
"""kind's layout, the ZDS socket's dir a dir of each node's own."""
STANDIN_TIMEOUT = 60.0
"""How long each node's ztunnel stand-in may take to connect and get its first snapshot."""
RESIDENT = "resident"
"""An ambient pod on each node for the whole run (named RESIDENT-NODE): a churn pod lives
seconds, so a restarted ztunnel stand-in's snapshot would often be empty; with a resident,
`ztunnel_restart` recovers only once the new stand-in's snapshot holds it."""
CONF_TMPFS_SIZE = "512k"
"""Room for the conflist, the agent's kubeconfig and its temp files, many times over."""


def open_bed(workdir: Path | None, *, pods_per_minute: float) -> NodesBed:
    """The bed, not started; BedUnavailable naming what this machine lacks for it."""
    missing = []
    if os.geteuid() != 0:
        missing.append("root (network namespaces, mounts, the nodes' processes)")
    try:
        images.image("istio-cni")
        images.image("workload")
        images.image("proxy")
        images.image("envoy")
    except MissingPartError as e:
        missing.append(f"the test bed's images ({e}; run ci/build-testbed-images, ci/build-image)")
    try:
        helm = _newest_helm()
    except MissingPartError as e:
        missing.append(str(e))
    if missing:
        raise BedUnavailable("; ".join(missing))
    if workdir is None:
        import tempfile

        workdir = Path(tempfile.mkdtemp(prefix="soak-"))
    return NodesBed(workdir, helm, pods_per_minute=pods_per_minute)


def _newest_helm() -> Path:
    found = {v: p for v, p in helm_binaries().items() if v.startswith("4.")}
    if not found:
        raise MissingPartError("no Helm 4.x (run ci/setup-helm)")
    return found[max(found, key=lambda v: tuple(int(x) for x in v.split(".")))]


class NodesBed:
    def __init__(self, workdir: Path, helm_binary: Path, *, pods_per_minute: float) -> None:
        self.workdir = workdir
        self.interval = 60.0 / pods_per_minute
        self.names = [f"tb-node-{i}" for i in range(1, NODE_COUNT + 1)]
        self.cluster = Nodes(workdir, count=NODE_COUNT, layout=SOAK_LAYOUT)
        self.helm = Helm(binary=helm_binary, home=workdir / "helm")
        self.stack = contextlib.ExitStack()
        self.core: Any = None
        self.image: images.Image | None = None
        self.proxy_image = ""
        self.envoy_image = ""
        self.proxy: ApiFaultProxy | None = None
        self.churn: Churn | None = None
        self.ambient_churn: Churn | None = None
        self.sidecar_check: sidecar.SidecarCheck | None = None
        self.standins: dict[str, ambient.NodeZtunnel] = {}
        self.epoch = 0.0
        self.revision = 0
        self._emitted: dict[str, tuple[float | None, bool | None]] = {}
        self._log_seen: dict[Path, int] = {}
        self._baseline: dict[str, set[str]] = {}
        self._pids: dict[str, tuple[str, int]] = {}

    # -- Bed -----------------------------------------------------------------------------------

    @property
    def nodes(self) -> Sequence[str]:
        return self.names

    def lacks(self) -> dict[str, str]:
        return dict(LACKS)

    def targets(self) -> dict[str, list[str]]:
        return {"node_reboot": list(self.names[1:])}

    def start(self) -> None:
        self.cluster.start()
        self.names = [n.node_name for n in self.cluster.members]
        for node in self.cluster.members:
            self._small_conf_dir(node)
        self.core = self.cluster.core()
        self.helm.kubeconfig = self.cluster.kubeconfig
        self.image = self.cluster.first.images["istio-cni"]
        proxy, envoy = images.image("proxy"), images.image("envoy")
        for node in self.cluster.members:
            node.import_image(proxy)
            node.import_image(envoy)
        self.proxy_image, self.envoy_image = proxy.ref, envoy.ref
        self._proxy_in_front()
        self.helm.install(
            agent_mod.RELEASE,
            agent_mod.CHART,
            namespace=agent_mod.AGENT_NAMESPACE,
            values=self._values(0),
        )
        # A second revision, so that a rollback has one to go back to from the start.
        self._upgrade()
        self._wait_rolled_out()
        for node in self.cluster.members:
            self._start_standin(node)

    def begin(self, epoch: float) -> None:
        self.epoch = epoch
        for node in self.cluster.members:
            self._baseline[node.node_name] = self._node_state(node)
        namespace = self.stack.enter_context(_namespace(self.core, "soak"))
        image = self.cluster.first.images["workload"].ref
        # Pods as Istio injects them with the CNI on: istio-validation before the app, so a
        # pod whose sandbox got no redirect (the runtime loaded a conflist without our entry
        # that a primary had just rewritten) waits for the agent's repair instead of running.
        validation = kubepods.validation_container(self.proxy_image)
        # Their istio-proxy is a real Envoy; their app calls its node's echo server from its
        # first instant, and the answer tells whether Envoy was in between (bench/soak/sidecar).
        servers = sidecar.EchoServers(self.core, namespace, image, self.names)
        servers.start()
        self.sidecar_check = sidecar.SidecarCheck(self.core, namespace, self.cluster.pod_netns)
        self.churn = Churn(
            self.core,
            self.cluster,
            namespace,
            image,
            nodes=self.names,
            interval=self.interval * 2,  # half the pods, the other half ambient
            settle_timeout=SETTLE_S,
            init_containers=[validation],
            captured=self.sidecar_check,
            proxy_image=self.envoy_image,
            node_app_command=servers.command,
        )
        self.churn.__enter__()
        meshed = self.stack.enter_context(_namespace(self.core, "soak-ambient"))
        labels = {ambient.MODE_LABEL: "ambient"}
        self.core.patch_namespace(meshed, {"metadata": {"labels": labels}})
        self._start_residents(meshed, image)
        self.ambient_churn = Churn(
            self.core,
            self.cluster,
            meshed,
            image,
            nodes=self.names,
            interval=self.interval * 2,
            settle_timeout=SETTLE_S,
            prefix="ambient",
            sidecar=False,
            app_command=ambient.CONNECT_LOOP,
            captured=ambient.AmbientCheck(self.core, meshed, self.cluster.pod_netns, self.standins),
        )
        self.ambient_churn.__enter__()

    def fault(self, kind: FaultKind, node: str | None) -> Fault:
        return actions.build(kind, node, self._parts())

    def pod_events(self) -> list[PodEvent]:
        events = []
        for churn, mode in ((self.churn, "sidecar"), (self.ambient_churn, "ambient")):
            if churn is None:
                continue
            for pod in list(churn.report.pods):
                state = (pod.running, pod.captured)
                if self._emitted.get(pod.name) == state:
                    continue
                self._emitted[pod.name] = state
                running = None if pod.running is None else pod.running - self.epoch
                at = running if running is not None else time.monotonic() - self.epoch
                events.append(
                    PodEvent(
                        at,
                        pod.name,
                        pod.node or "",
                        mode,
                        pod.created - self.epoch,
                        running,
                        pod.captured,
                        dict(pod.phases),
                    )
                )
        return events

    def agent_samples(self) -> list[AgentSample]:
        at = time.monotonic() - self.epoch
        found = []
        for node in self.cluster.members:
            with contextlib.suppress(Exception):  # no agent there now (killed, replaced)
                sample = procstats.read(self._agent_pid(node), node=node.node_name, at=at)
                if sample is not None:
                    found.append(sample)
        return found

    def files(self) -> list[FilesState]:
        return [self._files(node) for node in self.cluster.members]

    def uninstalls(self) -> list[tuple[float, str, str]]:
        at = time.monotonic() - self.epoch
        found = []
        for node in self.cluster.members:
            pattern = f"{agent_mod.AGENT_NAMESPACE}_*/{agent_mod.AGENT_CONTAINER}/*.log"
            for log in node.kubelet_dirs.pod_logs.glob(pattern):
                with contextlib.suppress(OSError):
                    lines = log.read_text(errors="replace").splitlines()
                    seen = self._log_seen.get(log, 0)
                    self._log_seen[log] = len(lines)
                    self._keep_log(node.node_name, log, lines[seen:])
                    found += [
                        (at, node.node_name, f"{log.parent.parent.name}: {line[:300]}")
                        for line in lines[seen:]
                        if UNINSTALLED.search(line)
                    ]
        return found

    def _keep_log(self, node: str, log: Path, lines: list[str]) -> None:
        """The agents' log lines appended under the workdir (agent-logs/NODE/POD.N.log) as they
        are read, so that those of a replaced pod or a killed container (kubelet removes them)
        stay for the report's reader."""
        if not lines:
            return
        kept = self.workdir / "agent-logs" / node / f"{log.parent.parent.name}.{log.name}"
        kept.parent.mkdir(parents=True, exist_ok=True)
        with kept.open("a") as f:
            f.writelines(line + "\n" for line in lines)

    def drain(self) -> None:
        for churn in (self.churn, self.ambient_churn):
            if churn is not None:
                with contextlib.suppress(Exception):  # pods that never ran are the report's
                    churn.__exit__(None, None, None)
        self.stack.close()  # the churn namespace's pods deleted and waited away
        if self.churn is not None and self.sidecar_check is not None:
            judged = sum(1 for p in self.churn.report.pods if p.captured is not None)
            log.info(
                "sidecar pods captured by an answer through their Envoy: %d of %d judged "
                "(the others by Istio's rules in their netns: no answer within %.0f s)",
                self.sidecar_check.through_proxy, judged, sidecar.FIRST_CONNECT_S,
            )  # fmt: skip
        for name, standin in self.standins.items():
            for tolerated in standin.tolerated:
                log.info("ztunnel stand-in on %s let through: %s", name, tolerated)

    def leftovers(self) -> list[str]:
        """What each node holds now and did not before the churn (netns, links, chains,
        tables, sets, files), and pod cgroups of no pod the API server knows; looked at again
        for SETTLE_S while anything is found, so a cleanup still under way is no leftover."""
        deadline = time.monotonic() + SETTLE_S
        while True:
            found = self._left_now()
            if not found or time.monotonic() > deadline:
                return found
            time.sleep(2.0)

    def _left_now(self) -> list[str]:
        pods = {p.metadata.uid for p in self.core.list_pod_for_all_namespaces().items}
        found = []
        for node in self.cluster.members:
            before = self._baseline.get(node.node_name, set())
            left = self._node_state(node) - before
            left |= {f"cgroup pod{uid}" for uid in self._pod_cgroups(node) - pods}
            standin = self.standins.get(node.node_name)
            if standin is not None:
                left |= {f"ztunnel stand-in holds {w}" for w in standin.held()}
                left |= {f"ztunnel stand-in refused: {v}" for v in standin.violations}
            found += [f"{node.node_name}: {item}" for item in sorted(left)]
        return found

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.stack.close()
        for standin in self.standins.values():
            with contextlib.suppress(Exception):
                standin.close()
        with contextlib.suppress(Exception):
            self.helm.uninstall(agent_mod.RELEASE, namespace=agent_mod.AGENT_NAMESPACE)
        if self.proxy is not None:
            self.proxy.stop()
        self.cluster.stop()

    # -- parts ---------------------------------------------------------------------------------

    def _values(self, revision: int) -> dict[str, Any]:
        assert self.image is not None
        preset = yaml.safe_load(PRESET.read_text()) or {}
        return {
            **preset,
            "hub": self.image.hub,
            "tag": self.image.tag,
            "pullPolicy": "Never",
            "podAnnotations": {"soak.istio-cni.test/revision": str(revision)},
            "ambient": {"enabled": True, "ztunnelSocketPath": ambient.ZDS_SOCKET},
        }

    def _upgrade(self) -> None:
        self.revision += 1
        self.helm.upgrade(
            agent_mod.RELEASE,
            agent_mod.CHART,
            namespace=agent_mod.AGENT_NAMESPACE,
            values=self._values(self.revision),
        )

    def _rollback(self) -> None:
        self.helm.run("rollback", agent_mod.RELEASE, "--namespace", agent_mod.AGENT_NAMESPACE)

    def _once_api_answers(self, op: Callable[[], None]) -> Callable[[], None]:
        """`op` run once the API server answers (up to API_WAIT_S): Helm needs it."""

        def run() -> None:
            plane = self.cluster.first.plane
            assert plane is not None
            deadline = time.monotonic() + API_WAIT_S
            while True:
                with contextlib.suppress(OSError):
                    if plane.readyz()[0]:
                        break
                if time.monotonic() > deadline:
                    raise actions.ActError(f"the API server not ready in {API_WAIT_S:.0f} s")
                time.sleep(1.0)
            op()

        return run

    def _rolled_out(self) -> bool:
        apps = self.cluster.first.apps()
        for ds in apps.list_namespaced_daemon_set(agent_mod.AGENT_NAMESPACE).items:
            if not ds.metadata.name.startswith(agent_mod.RELEASE):
                continue
            s = ds.status
            want = s.desired_number_scheduled
            if not (
                ds.metadata.generation == s.observed_generation
                and s.updated_number_scheduled == want
                and s.number_ready == want
            ):
                return False
        return True

    def _wait_rolled_out(self) -> None:
        deadline = time.monotonic() + ROLLOUT_TIMEOUT
        while not self._rolled_out():
            if time.monotonic() > deadline:
                raise BedUnavailable(f"the agents not rolled out in {ROLLOUT_TIMEOUT:.0f} s")
            time.sleep(1.0)

    def _proxy_in_front(self) -> None:
        """One fault proxy on the API server's address; every node's `kubernetes` Service
        DNAT pointed at it (first in its chain), so the agents (host network) go through it."""
        plane = self.cluster.first.plane
        assert plane is not None and plane.ca is not None
        self.proxy = ApiFaultProxy(
            self.workdir / "apifaults",
            plane.ca,
            (plane.address, plane.port),
            plane.address,
            (SERVICE_IP,),
        )
        self.proxy.start()
        rule = [
            "-d",
            f"{SERVICE_IP}/32",
            "-p",
            "tcp",
            "--dport",
            "443",
            "-j",
            "DNAT",
            "--to-destination",
            f"{self.proxy.address}:{self.proxy.port}",
        ]
        for node in self.cluster.members:
            iptables(node.network.netns_name, "-t", "nat", "-I", "OUTPUT", "1", *rule)

    def _set_proxy_fault(self, which: str) -> Any:
        assert self.proxy is not None
        self.proxy.set_fault(PROXY_FAULTS[which])
        return self.proxy.clear

    def _member(self, name: str) -> RealCluster:
        return self.cluster.node(name)

    def _start_standin(self, node: RealCluster) -> None:
        """The node's ztunnel stand-in on the socket its agent serves (as the machine sees it),
        once it has the agent's first snapshot."""
        socket = node.host_path(ambient.ZDS_DIR) / Path(ambient.ZDS_SOCKET).name
        standin = ambient.NodeZtunnel(node.node_name, socket, self.core)
        self.standins[node.node_name] = standin
        standin.start()
        deadline = time.monotonic() + STANDIN_TIMEOUT
        while not standin.has_snapshot_of(()):
            if time.monotonic() > deadline:
                raise BedUnavailable(
                    f"the ztunnel stand-in on {node.node_name} got no snapshot at {socket} "
                    f"in {STANDIN_TIMEOUT:.0f} s"
                )
            time.sleep(0.2)

    def _start_residents(self, namespace: str, image: str) -> None:
        """One ambient pod per node, Running and handed to the node's stand-in before the churn
        begins; deleted with the namespace at the drain."""
        for node in self.names:
            manifest = kubepods.pod_manifest(
                f"{RESIDENT}-{node}", image, app_command=["sleep"], sidecar=False
            )
            manifest["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
            self.core.create_namespaced_pod(namespace, manifest)
        for node in self.names:
            name = f"{RESIDENT}-{node}"
            uid = kubepods.wait_running(self.core, namespace, name, ready=False).uid
            standin = self.standins[node]
            kubepods.wait_for(
                partial(standin.added, uid),
                f"{namespace}/{name} handed to the ztunnel stand-in on {node}",
                STANDIN_TIMEOUT,
            )

    def _ztunnel_restart(self, name: str) -> None:
        self.standins[name].restart()

    def _ztunnel_whole(self, name: str) -> bool:
        """The node's stand-in holds every ambient pod running there (from a snapshot since its
        restart, or an AddWorkload after it)."""
        assert self.ambient_churn is not None
        selector = f"spec.nodeName={name}"
        pods = self.core.list_namespaced_pod(self.ambient_churn.namespace, field_selector=selector)
        running = [
            p.metadata.uid
            for p in pods.items
            if p.status.phase == "Running" and p.metadata.deletion_timestamp is None
        ]
        return self.standins[name].has_snapshot_of(running)

    def _agent_pod(self, node: RealCluster) -> Any:
        pods = [
            p
            for p in agent_mod.agent_pods(self.core)
            if p.spec.node_name == node.node_name and p.metadata.deletion_timestamp is None
        ]
        if not pods:
            raise actions.ActError(f"no agent pod on {node.node_name}")
        return max(pods, key=lambda p: p.metadata.creation_timestamp)

    def _agent_pid(self, node: RealCluster) -> int:
        """The pid of the node's agent process; the runtime is asked again only when the pod
        changed or the process is gone (a kill -9: kubelet starts another in the same pod), so
        sampling does not wait on `ctr` every round."""
        known = self._pids.get(node.node_name)
        try:
            uid = self._agent_pod(node).metadata.uid
        except Exception:  # the API down (another fault): the process last seen, if alive
            if known is not None and Path(f"/proc/{known[1]}").exists():
                return known[1]
            raise
        if known is not None and known[0] == uid and Path(f"/proc/{known[1]}").exists():
            return known[1]
        pid = node.cri.running_container(uid, agent_mod.AGENT_CONTAINER)[1]
        self._pids[node.node_name] = (uid, pid)
        return pid

    def _delete_agent_pod(self, name: str) -> None:
        pod = self._agent_pod(self._member(name))
        self.core.delete_namespaced_pod(pod.metadata.name, agent_mod.AGENT_NAMESPACE)

    def _runtime_restart(self, name: str) -> None:
        runtime = self._member(name).cri
        runtime.stop()
        runtime.start()

    def _node_reboot(self, name: str) -> None:
        node = self._member(name)
        if node is self.cluster.first:
            raise actions.ActError(f"{name} holds the control plane: it is never rebooted")
        times = node_reboot(node, self.core, agent_image=self.image)
        back = times.agent_image_back or times.kubelet_started
        log.info(
            "node_reboot@%s: kubelet started %.1f s after the kill, the agent's image back %.1f s",
            name,
            times.kubelet_started - times.killed,
            back - times.killed,
        )

    def _node_ready(self, name: str) -> bool:
        conditions = self.core.read_node(name).status.conditions or []
        return any(c.type == "Ready" and c.status == "True" for c in conditions)

    def _conflist(self, name: str) -> Path:
        return _conf_view(self._member(name)) / LAYOUT.conflist_name

    def _small_conf_dir(self, node: RealCluster) -> None:
        """The node's conf dir a tmpfs of its own, holding what the dir held; the runtime
        restarted, as it watches the dir it found at its start and would miss every later
        change (its containers keep running)."""
        assert node.mount_ns is not None
        node.mount_ns.run(["mount", "-t", "tmpfs", "-o", f"size={CONF_TMPFS_SIZE},mode=0755",
                           "tmpfs", LAYOUT.conf_dir])  # fmt: skip
        view = _conf_view(node)
        for f in node.host_path(LAYOUT.conf_dir).iterdir():
            if f.is_file():
                shutil.copy2(f, view / f.name)
        node.cri.stop()
        node.cri.start()

    def _primary(self, name: str) -> dict[str, Any]:
        return dict(json.loads(LAYOUT.conflist(self._member(name).pod_subnet)))

    def _plugin(self, name: str) -> Path:
        return self._member(name).host_path(LAYOUT.bin_dir) / "istio-cni"

    def _files(self, node: RealCluster) -> FilesState:
        name = node.node_name
        try:
            types = [p.get("type") for p in json.loads(self._conflist(name).read_text())["plugins"]]
        except (OSError, ValueError, KeyError) as e:
            return FilesState(name, False, f"conflist unreadable: {e}")
        if "istio-cni" not in types:
            return FilesState(name, False, f"conflist plugins {types}: our entry missing")
        if not os.access(self._plugin(name), os.X_OK):
            return FilesState(name, False, "the plugin binary missing from the bin dir")
        return FilesState(name, True, "")

    def _node_healthy(self, name: str) -> bool:
        node = self._member(name)
        pod = self._agent_pod(node)
        conditions = {c.type: c.status for c in pod.status.conditions or []}
        if conditions.get("Ready") != "True" or not self._files(node).working:
            return False
        # The runtime itself asked (the API's Ready is stale for a while after a kill -9 or a
        # runtime restart): it answers and runs the agent. Raises when it does not.
        node.cri.running_container(pod.metadata.uid, agent_mod.AGENT_CONTAINER)
        return True

    def _cluster_healthy(self) -> bool:
        plane = self.cluster.first.plane
        assert plane is not None
        return (
            plane.readyz()[0]
            and self._rolled_out()
            and all(self._node_healthy(n) for n in self.names)
        )

    def _daemon(self, name: str) -> tuple[Any, Any]:
        plane = self.cluster.first.plane
        assert plane is not None
        daemon = next(d for d in plane.daemons if d.name == name)
        return daemon.stop, daemon.start

    def _parts(self) -> actions.Parts:
        return actions.Parts(
            agent_pid=lambda name: self._agent_pid(self._member(name)),
            delete_agent_pod=self._delete_agent_pod,
            runtime_restart=self._runtime_restart,
            node_reboot=self._node_reboot,
            node_ready=self._node_ready,
            conflist=self._conflist,
            primary_conf=self._primary,
            plugin=self._plugin,
            conf_dir=lambda name: self._conflist(name).parent,
            node_healthy=self._node_healthy,
            cluster_healthy=self._cluster_healthy,
            daemons={d: self._daemon(d) for d in ("kube-apiserver", "etcd")},
            api_fault=self._set_proxy_fault,
            helm={
                "upgrade": self._once_api_answers(self._upgrade),
                "rollback": self._once_api_answers(self._rollback),
            },
            ztunnel_restart=self._ztunnel_restart,
            ztunnel_whole=self._ztunnel_whole,
        )

    # -- what a node holds ---------------------------------------------------------------------

    def _node_state(self, node: RealCluster) -> set[str]:
        """Everything on the node a pod could leave behind, one line each: netns files, links,
        iptables chains (both backends, both families) and nft tables of the node's netns,
        ipset sets and members, and the files of the CNI dirs."""
        ns = node.network.netns_name
        state: set[str] = set()
        netns_dir = node.host_path("/var/run/netns")
        with contextlib.suppress(OSError):
            state |= {f"netns {p.name}" for p in netns_dir.iterdir()}
        for line in _in_netns(ns, "ip", "-o", "link", "show").splitlines():
            state.add("link " + line.split(":")[1].strip().split("@")[0])
        for save in ("iptables-legacy-save", "iptables-nft-save", "ip6tables-legacy-save",
                     "ip6tables-nft-save"):  # fmt: skip
            table = ""
            for line in _in_netns(ns, save).splitlines():
                if line.startswith("*"):
                    table = line[1:]
                elif line.startswith(":"):
                    state.add(f"chain {save.removesuffix('-save')} {table} {line[1:].split()[0]}")
        for line in _in_netns(ns, "nft", "list", "tables").splitlines():
            state.add(line.strip())
        for line in _in_netns(ns, "ipset", "save").splitlines():
            state.add(f"ipset {line.strip()}")
        for d, path in ((LAYOUT.conf_dir, _conf_view(node)),
                        (LAYOUT.bin_dir, node.host_path(LAYOUT.bin_dir))):  # fmt: skip
            with contextlib.suppress(OSError):
                state |= {f"file {d}/{p.name}" for p in path.iterdir()}
        return state

    @staticmethod
    def _pod_cgroups(node: RealCluster) -> set[str]:
        """UIDs of the pods with a cgroup under the node's kubelet root (pids hierarchy)."""
        root = node.record.kubelet_cgroup_root if node.record else ""
        base = Path("/sys/fs/cgroup/pids") / root.lstrip("/")
        if not root or not base.is_dir():
            return set()
        # kubelet's cgroupfs names: pod<uid> (the uid's dashes kept)
        return {p.name[3:] for p in base.rglob("pod*") if p.is_dir()}


def _conf_view(node: RealCluster) -> Path:
    """The node's conf dir as its runtime and agents see it (the tmpfs in its mount namespace),
    from the machine: through the namespace holder's root."""
    assert node.mount_ns is not None
    return Path(node.mount_ns.path).parent.parent / "root" / LAYOUT.conf_dir.lstrip("/")


def _in_netns(ns: str, *argv: str) -> str:
    done = subprocess.run(
        ["ip", "netns", "exec", ns, *argv], capture_output=True, text=True, timeout=30
    )
    return done.stdout if done.returncode == 0 else ""


@contextlib.contextmanager
def _namespace(core: Any, prefix: str) -> Any:
    from testbed import kubepods

    with kubepods.pod_namespace(core, prefix) as name:
        yield name
