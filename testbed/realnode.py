"""A real single-node cluster: the test bed's control plane (with kube-scheduler and the
controllers pods need), and a node run by kubelet and containerd in its own network namespace.

    RealCluster.start():
      node netns + veth            (nodenet.py: no route out; kube-proxy's DNAT for `kubernetes`)
      control plane                (controlplane.py, listening on the veth's root end)
      node dir, made a shared mount (the DaemonSet's HostToContainer mounts need one)
      CNI dirs                     (Debian's reference plugins, bridge + host-local + portmap)
      containerd + images          (containerd.py, images.py; relayout() to OpenShift's layout
                                    swaps in CRI-O, crio.py, to a layout on containerd 2 that,
                                    containerd2.py)
      kubelet                      (kubelet.py), then waits for the Node to be Ready
      with `services`: kube-proxy and CoreDNS (services.py), kubelet's clusterDNS theirs
    RealCluster.stop(): the reverse, then nodeclean.clean(): nothing stays behind.

The node's dirs: `node_dirs` (the CNI bin and conf dirs and the pod netns dir as chart values
name them) and `agent_run_dir`; `conflist_path` and `netns_dir` as the machine sees them. Those
follow the node's layout (relayout); `cni_bin_dir` and `cni_conf_dir` are the test bed's own.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from kubernetes import config as k8s_config

from testbed import images, nodeclean, parts
from testbed.cni import bridge_plugin, link_plugins, reference_conflist
from testbed.cni_double import write_double
from testbed.containerd import Containerd, ContainerdDirs
from testbed.containerd2 import Containerd2
from testbed.controlplane import (
    NODE_CONTROLLERS,
    SERVICE_CIDR,
    SERVICE_IP,
    Binaries,
    ControlPlane,
)
from testbed.crio import Crio, CrioDirs
from testbed.kubelet import Kubelet, KubeletDirs
from testbed.mountns import Bind, MountNamespace, Overlay
from testbed.nodenet import NodeNetwork
from testbed.platforms import Platform
from testbed.process import PartFailedError
from testbed.services import CLUSTER_DNS, CLUSTER_DOMAIN, NodeServices
from testbed.wait import explain

NODE_NAME = "tb-node"
LAYOUT_NETNS_DIR = "/var/run/netns"
"""Where the runtime of every platform layout mounts pod network namespaces (a node path)."""
HOST_LOCAL_DIR = "/var/lib/cni/networks"
"""host-local's default dataDir (a node path)."""
log = logging.getLogger(__name__)
READY_TIMEOUT = 180.0
KUBELET_RACE = "fatal error: concurrent map"
"""How the Go runtime ends kubelet 1.35 when, starting, its node status reads the container
manager's capacity map while another goroutine writes it (cm.GetCapacity). A node's service
manager starts kubelet again (systemd's Restart=always); so does the test bed, once a start."""


@dataclass(frozen=True)
class NodeDirs:
    """The node's CNI bin and conf dirs and pod netns dir, as node paths."""

    cni_bin: str
    cni_conf: str
    netns: str


class RealCluster:
    """start() then stop() (always; idempotent). `workdir/logs` keeps every component's log."""

    def __init__(
        self,
        workdir: Path,
        *,
        node_name: str = NODE_NAME,
        image_names: tuple[str, ...] = ("pause", "workload", "istio-cni"),
        max_pods: int = 110,
        plane: ControlPlane | None = None,
        controllers: str = NODE_CONTROLLERS,
        layout: Platform | None = None,
        register_taints: tuple[str, ...] = (),
        pod_subnet: str | None = None,
        kube: parts.Kube | None = None,
        services: bool = False,
    ) -> None:
        """`plane`: join the control plane of another RealCluster (reached over this node's own
        link) instead of starting one. `layout`: laid out as that platform from the start (no
        pod ever runs in the test bed's own layout). `register_taints`: `key=value:Effect`
        taints kubelet registers the Node with. `kube`: the Kubernetes release of its control
        plane and kubelet (parts.kube(version); the test bed's pinned one by default).
        `services`: Services routed on the node and cluster DNS for its pods
        (testbed/services.py; the EndpointSlice controller runs too)."""
        if layout is not None and layout.runtime != "containerd":
            raise ValueError(f"{layout.name}: only a containerd layout can be made at start")
        if services and plane is not None:
            raise ValueError("services: the node's Services need a control plane of its own")
        if services and "endpointslice" not in controllers.split(","):
            controllers += ",endpointslice"  # a Service with a selector gets its endpoints
        self.services_enabled = services
        self.workdir = workdir
        self.shared_plane = plane
        self.controllers = controllers
        self.layout = layout
        self.register_taints = register_taints
        self.max_pods = max_pods
        self.node_name = node_name
        self.log_dir = workdir / "logs"
        self.base = workdir / "node"
        self.network = NodeNetwork()
        self.cni_network = f"tbnet-{secrets.token_hex(3)}"
        self.bridge = f"tbbr{secrets.token_hex(4)}"
        # A subnet of its own: the agent's repair finds pods by address among every netns of the
        # machine, where other test runs' pods may use the test bed's default subnet.
        self.pod_subnet = (
            pod_subnet or f"10.{secrets.randbelow(40) + 200}.{secrets.randbelow(256)}.0/24"
        )
        self.cni_bin_dir = self.base / "cni" / "bin"
        self.cni_conf_dir = self.base / "cni" / "net.d"
        self.agent_run_dir = self.base / "run" / "istio-cni"
        self.runtime_dirs = ContainerdDirs(self.base / "containerd")
        self.kubelet_dirs = KubeletDirs(self.base / "kubelet")
        # Parts are looked up first: a missing one fails before anything is started.
        self.kube = kube or parts.kube()
        self.binaries = Binaries.from_cache(scheduler=True, kube=self.kube)
        self.kube.part("kubelet").require()
        if services:
            parts.kube_proxy().require()
            parts.coredns().require()
        for tool, package in (
            ("containerd", "containerd"),
            ("ctr", "containerd"),
            ("containerd-shim-runc-v2", "containerd"),
            ("runc", "runc"),
            ("nsenter", "util-linux"),
            ("iptables", "iptables"),
        ):
            parts.debian_tool(tool, package).require()
        self.plugins_dir = parts.cni_plugins_dir()
        self.images = {name: images.image(name) for name in image_names}
        self.plane: ControlPlane | None = plane
        self.runtime: Containerd | None = None
        self.crio: Crio | None = None
        """CRI-O, made by the first layout of a platform that runs it (OpenShift)."""
        self.containerd2: Containerd2 | None = None
        """containerd 2, made by the first layout that runs it (its own dirs and images)."""
        self.kubelet: Kubelet | None = None
        self.services: NodeServices | None = None
        self.record: nodeclean.NodeRecord | None = None
        self.platform: Platform | None = None
        self.mount_ns: MountNamespace | None = None
        self.timings: dict[str, float] = {}
        self._api: Any = None

    # -- the node's paths -------------------------------------------------------------------

    @property
    def netns_dir(self) -> Path:
        """Where the runtime mounts pod network namespaces, as the machine sees it: under
        containerd's state dir in the test bed's own layout, the layout's /var/run/netns in a
        platform's (through its mount namespace: the netns mounts are made there only)."""
        if self.mount_ns is not None:
            # /var/run is a link to /run: resolved here, as through /proc/<pid>/root an absolute
            # link leads back to the machine's own.
            return self.mount_ns.root / _resolved(LAYOUT_NETNS_DIR).lstrip("/")
        return self.runtime_dirs.netns_dir

    @property
    def registry_config_dir(self) -> Path:
        """containerd's registry hosts dir (a `<host:port>/hosts.toml` per registry)."""
        return self.runtime_dirs.base / "certs.d"

    @property
    def conflist_path(self) -> Path:
        """The node's primary CNI config as the machine sees it: the layout's provider's file,
        else the test bed's own."""
        if self.platform is not None:
            return self.host_path(self.platform.conf_dir) / self.platform.conflist_name
        return self.cni_conf_dir / f"10-{self.cni_network}.conflist"

    @property
    def node_dirs(self) -> NodeDirs:
        """The node's dirs as it is laid out now, as node paths (chart values name these;
        kubelet resolves them in the layout's mount namespace)."""
        if self.platform is not None:
            platform = self.platform
            return NodeDirs(platform.bin_dir, platform.conf_dir, LAYOUT_NETNS_DIR)
        return NodeDirs(str(self.cni_bin_dir), str(self.cni_conf_dir), str(self.netns_dir))

    @property
    def ipam_dir(self) -> Path:
        """host-local's allocations of the node's primary network (a file per address, naming
        the sandbox it went to), as the machine sees it."""
        if self.platform is None:
            return self.base / "ipam" / self.cni_network
        config = json.loads(self.primary_conflist())
        plugins = config.get("plugins", [config])  # a conflist, or a single plugin's conf
        ipams = [p["ipam"] for p in plugins if p.get("ipam", {}).get("type") == "host-local"]
        data_dir = str(ipams[0].get("dataDir", HOST_LOCAL_DIR)) if ipams else HOST_LOCAL_DIR
        return self.host_path(data_dir) / str(config["name"])

    def primary_conflist(self) -> str:
        """The text of the node's primary CNI config as the layout writes it (no agent's entry):
        the provider's file, else the test bed's own."""
        if self.platform is not None:
            return self.platform.conflist(self.pod_subnet)
        return json.dumps(self.reference_conflist(), indent=2) + "\n"

    @property
    def kubeconfig(self) -> Path:
        assert self.plane is not None
        return self.plane.kubeconfig

    @property
    def cri(self) -> Containerd | Crio:
        """The runtime kubelet talks to now: the layout's (CRI-O for OpenShift, containerd 2),
        else containerd."""
        if self.platform is not None and self.platform.runtime == "crio":
            assert self.crio is not None
            return self.crio
        if self.platform is not None and self.platform.runtime == "containerd2":
            assert self.containerd2 is not None
            return self.containerd2
        assert self.runtime is not None
        return self.runtime

    def reference_conflist(self) -> dict[str, Any]:
        return reference_conflist(
            self.cni_network, self.bridge, self.pod_subnet, self.base / "ipam"
        )

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        began = time.monotonic()
        nodeclean.sweep_stale()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.base.mkdir(parents=True, exist_ok=True)
        self.record = nodeclean.NodeRecord(
            owner_pid=os.getpid(),
            base=str(self.base),
            netns_name=self.network.netns_name,
            host_ifname=self.network.host_ifname,
            runtime_socket=str(self.runtime_dirs.socket),
            runc_root=str(self.runtime_dirs.runc_root),
            cni_network=self.cni_network,
            sysctls=nodeclean.snapshot_sysctls(),
            made_log_links_dir=not nodeclean.CONTAINER_LOG_LINKS.exists(),
            made_xtables_lock=not nodeclean.XTABLES_LOCK.exists(),
            made_cgroups=nodeclean.missing_runtime_cgroups(),
            kubelet_cgroup_root=f"/istio-cni-testbed-{self.network.netns_name}",
        )
        self.record.save()  # before anything exists that a crash could leave behind
        # An interrupted session may skip fixture teardown; exit handlers still run.
        atexit.register(self._stop_at_exit)

        self.network.create()
        if self.shared_plane is None:
            self.plane = ControlPlane(
                self.workdir / "controlplane",
                self.binaries,
                address=self.network.gateway,
                controllers=self.controllers,
                kubelet_client=True,
            )
            self.plane.start()
            self.timings["control plane"] = time.monotonic() - began
        else:  # the API server listens on the first node's link; this node reaches it over its own
            self.network.route_host(self.shared_plane.address)
        assert self.plane is not None
        self.network.route_service(
            SERVICE_CIDR, SERVICE_IP, 443, self.plane.address, self.plane.port
        )
        self._make_node_dirs()
        prefix, bin_dir, conf_dir, under_state = self._enter_layout(self.layout)
        self.runtime = Containerd(
            self.runtime_dirs,
            self.log_dir / "containerd.log",
            prefix=prefix,
            sandbox_image=self.images["pause"].ref,
            cni_bin_dir=bin_dir,
            cni_conf_dir=conf_dir,
        )
        self.runtime.netns_under_state = under_state
        self.runtime.start()
        self.timings["containerd"] = time.monotonic() - began
        for image in self.images.values():
            self.runtime.import_image(image.archive)
        self.timings["images imported"] = time.monotonic() - began
        assert self.plane.ca is not None
        self.kubelet = Kubelet(
            self.kubelet_dirs,
            node_name=self.node_name,
            node_ip=self.network.node_ip,
            server=self.plane.server,
            ca=self.plane.ca,
            runtime_socket=self.runtime_dirs.socket,
            prefix=prefix,
            log_path=self.log_dir / "kubelet.log",
            cgroup_root=self.record.kubelet_cgroup_root,
            max_pods=self.max_pods,
            register_taints=self.register_taints,
            kube=self.kube,
            cluster_dns=(CLUSTER_DNS, CLUSTER_DOMAIN) if self.services_enabled else None,
        )
        self.kubelet.prepare()
        nodeclean.make_cgroups(self.record.kubelet_cgroup_root)
        self.kubelet.start()
        self.wait_node_ready()
        self.timings["node Ready"] = time.monotonic() - began
        if self.services_enabled:
            self.core()
            self.services = NodeServices(
                self.workdir / "services",
                self.log_dir,
                prefix=self.network.nsenter(),
                plane=self.plane,
                node_name=self.node_name,
                node_ip=self.network.node_ip,
                pod_subnet=self.pod_subnet,
            )
            self.services.start(self._api)
            self.timings["services"] = time.monotonic() - began

    def _make_node_dirs(self) -> None:
        # A shared mount, as / is on a systemd host: containerd's and kubelet's mounts below it
        # propagate into containers with HostToContainer (the agent's netns mount), and unmount
        # from one place.
        _run(["mount", "--bind", str(self.base), str(self.base)])
        _run(["mount", "--make-rshared", str(self.base)])
        for d in (self.cni_bin_dir, self.cni_conf_dir, self.agent_run_dir):
            d.mkdir(parents=True, exist_ok=True)
        link_plugins(self.plugins_dir, self.cni_bin_dir)
        self.conflist_path.write_text(json.dumps(self.reference_conflist(), indent=2) + "\n")

    def _stop_at_exit(self) -> None:
        if self.record is not None:
            self.stop()

    def stop(self) -> None:
        """Stop kubelet, the runtime (and every container), the control plane; remove it all."""
        atexit.unregister(self._stop_at_exit)
        errors: list[str] = []
        if self.mount_ns is not None:  # its holder; nodeclean ends every process of the node
            self.mount_ns.close()
            self.mount_ns = None
        for name, stop in (
            ("services", self.services.stop if self.services else None),
            ("kubelet", self.kubelet.stop if self.kubelet else None),
            ("containerd", self.runtime.stop if self.runtime else None),
            ("crio", self.crio.stop if self.crio else None),
            ("containerd2", self.containerd2.stop if self.containerd2 else None),
        ):
            if stop is not None:
                try:
                    stop()
                except Exception as e:
                    errors.append(f"{name}: {e}")
        if self._api is not None:
            self._api.close()
            self._api = None
        if self.record is not None:
            errors += nodeclean.clean(self.record)
            self.record = None
        if self.plane is not None and self.shared_plane is None:
            self.plane.stop()
        try:
            self.network.delete()
        except Exception as e:
            errors.append(f"network: {e}")
        if errors:
            raise RuntimeError("real node cleanup: " + "; ".join(errors))

    def restart_node(
        self, *, reboot: bool = False, while_booting: Callable[[], None] | None = None
    ) -> None:
        """Stop kubelet and containerd with pods on the node, start both again, wait for Ready.
        Without `reboot` the containers keep running (the services restart); with it every
        container dies too, as in a reboot, and kubelet starts every pod again.
        `while_booting` runs once containerd is back and before kubelet starts (the moment
        a booting node's other services set up their files)."""
        assert self.kubelet is not None and self.record is not None
        runtime = self.cri
        self.kubelet.stop()
        runtime.stop()
        if reboot:
            nodeclean.kill_containers(self.record)
        runtime.start()
        if while_booting is not None:
            while_booting()
        self.kubelet.start()
        self.wait_node_ready()

    # -- platform layouts (testbed/platforms.py) ---------------------------------------------

    def platform_root(self, platform: Platform) -> Path:
        """Where `platform`'s node paths live, seen from the machine: <root>/<node path>."""
        return self.base / "platform" / platform.name

    def host_path(self, node_path: str) -> Path:
        """A node path of the current layout as the machine sees it."""
        if self.platform is None:
            return Path(node_path)
        if self.platform.bin_overlay and node_path == self.platform.bin_dir:
            return self.platform_root(self.platform) / "bin-upper"
        return self.platform_root(self.platform) / node_path.lstrip("/")

    def relayout(self, platform: Platform | None) -> None:
        """Lay the node out as `platform` (None: the test bed's own layout, as at start):
        kubelet and containerd stop and every container dies (the node's pods must be gone),
        the node's mount namespace is made anew with the platform's binds and files, and both
        start again in it, containerd with the platform's CNI dirs; returns once Ready."""
        assert self.kubelet is not None and self.runtime is not None and self.record is not None
        self.kubelet.stop()
        self.cri.stop()
        nodeclean.kill_containers(self.record)
        prefix, bin_dir, conf_dir, under_state = self._enter_layout(platform)
        self.kubelet.prefix = prefix
        if platform is not None and platform.runtime == "crio":
            socket = self._start_crio(prefix, platform)
        elif platform is not None and platform.runtime == "containerd2":
            socket = self._start_containerd2(prefix, bin_dir, conf_dir, under_state)
        else:
            self.runtime.prefix = prefix
            self.runtime.cni_bin_dir, self.runtime.cni_conf_dir = bin_dir, conf_dir
            self.runtime.netns_under_state = under_state
            self.runtime.start()
            self._import_missing(self.runtime)  # imported while another runtime ran the node
            socket = self.runtime_dirs.socket
        if self.kubelet.runtime_socket != socket:
            self.kubelet.runtime_socket = socket
            self.kubelet.write_config()
        self.kubelet.start()
        self.wait_node_ready()

    def _enter_layout(self, platform: Platform | None) -> tuple[list[str], Path, Path, bool]:
        """Make `platform`'s mount namespace (None: the node's own dirs, no namespace of its
        own); returns the runtime's (command prefix, CNI bin dir, CNI conf dir, netns under its
        state dir)."""
        if self.mount_ns is not None:
            self.mount_ns.close()
            self.mount_ns = None
        self.platform = platform
        if platform is None:
            return self.network.nsenter(), self.cni_bin_dir, self.cni_conf_dir, True
        self.mount_ns = self._platform_namespace(platform)
        return self.mount_ns.prefix(), Path(platform.bin_dir), Path(platform.conf_dir), False

    def _start_crio(self, prefix: list[str], platform: Platform) -> Path:
        """CRI-O in the layout's namespace with the platform's CNI dirs, every image of the
        node in its storage (kept across layouts); returns its socket."""
        if self.crio is None:
            self.crio = Crio(
                CrioDirs(self.base / "crio", self.runtime_dirs.runc_root / "crio"),
                self.log_dir / "crio.log",
                prefix=prefix,
                pause_image=self.images["pause"].ref,
                cni_bin_dir=platform.bin_dir,
                cni_conf_dir=platform.conf_dir,
            )
        else:
            self.crio.prefix = prefix
            self.crio.cni_bin_dir, self.crio.cni_conf_dir = platform.bin_dir, platform.conf_dir
        self.crio.import_images(self.images.values())
        self.crio.start()
        return self.crio.socket

    def _start_containerd2(
        self, prefix: list[str], bin_dir: Path, conf_dir: Path, under_state: bool
    ) -> Path:
        """containerd 2 in the layout's namespace with its CNI dirs, in dirs of its own below the
        node's (its runc root the node's, which nodeclean sweeps), every image of the node
        imported (kept across layouts); returns its socket."""
        assert self.record is not None
        if self.containerd2 is None:
            # Its state (container rootfs mount points) where a user-namespaced pod's root can
            # look them up: runc's init does so as that root (nodeclean.NodeRecord.traversable_dir).
            dirs = ContainerdDirs(
                self.base / "containerd2",
                runc_dir=self.runtime_dirs.runc_root,
                state_dir=self.record.make_traversable_dir() / "containerd2",
            )
            self.containerd2 = Containerd2(
                dirs,
                self.log_dir / "containerd2.log",
                prefix=prefix,
                sandbox_image=self.images["pause"].ref,
                cni_bin_dir=bin_dir,
                cni_conf_dir=conf_dir,
            )
            self.record.other_runtime_sockets.append(str(dirs.socket))
            self.record.save()
        runtime = self.containerd2
        runtime.prefix = prefix
        runtime.cni_bin_dir, runtime.cni_conf_dir = bin_dir, conf_dir
        runtime.netns_under_state = under_state
        runtime.start()
        self._import_missing(runtime)
        return runtime.dirs.socket

    def _platform_namespace(self, platform: Platform) -> MountNamespace:
        assert self.record is not None
        root = self.platform_root(platform)
        if root.exists():  # a layout made before: the platform's files as it first wrote them
            nodeclean.unmount_below(root)
            shutil.rmtree(root)
        binds = [Bind(root / p.lstrip("/"), p) for p in platform.node_paths()]
        overlays = []
        for bind in binds:
            bind.source.mkdir(parents=True, exist_ok=True)
        bin_dir = self.host_path(platform.bin_dir)
        if platform.bin_overlay:
            overlays.append(Overlay(_resolved(platform.bin_dir), bin_dir, root / "bin-work"))
            bin_dir.mkdir(parents=True)
        link_plugins(self.plugins_dir, bin_dir)
        delegate = bridge_plugin(self.bridge, self.pod_subnet)  # host-local's default dataDir
        for double in platform.doubles:
            write_double(bin_dir, double.plugin_type, double.mode, delegate)
        for part in platform.built:  # plugins the test bed builds (Multus), linked as Debian's
            (bin_dir / part.name).unlink(missing_ok=True)  # in place of Debian's of that name
            (bin_dir / part.name).symlink_to(part.require())
        if platform.kubeconfig:  # the primary's credentials (the admin's, here)
            kubeconfig = self.host_path(platform.kubeconfig)
            kubeconfig.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(self.kubeconfig, kubeconfig)
            kubeconfig.chmod(0o600)
        if platform.flannel_subnet_env:
            network = ".".join(self.pod_subnet.split(".")[:2]) + ".0.0/16"
            gateway = self.pod_subnet.replace(".0/24", ".1/24")
            (self.host_path("/run/flannel") / "subnet.env").write_text(
                f"FLANNEL_NETWORK={network}\nFLANNEL_SUBNET={gateway}\n"
                "FLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n"
            )
        conflist = self.host_path(platform.conf_dir) / platform.conflist_name
        conflist.write_text(platform.conflist(self.pod_subnet))
        namespace = MountNamespace(self.network.nsenter(), [str(self.base)])
        try:
            namespace.create(binds, overlays)
        finally:
            self.record.made_dirs = sorted(set(self.record.made_dirs) | set(namespace.made_dirs))
            self.record.save()
        return namespace

    def import_image(self, image: images.Image) -> None:
        """Into the runtime that runs the node now (containerd 1.6, CRI-O's storage or
        containerd 2); the others, stopped, get it at their next start (relayout)."""
        runtime = self.cri
        if isinstance(runtime, Crio):
            runtime.import_images([image])
        else:
            runtime.import_image(image.archive)
        self.images[image.name] = image

    def _import_missing(self, runtime: Containerd) -> None:
        """Every image of the node into `runtime` (started) that it does not hold yet."""
        present = runtime.images()
        for image in self.images.values():
            if image.ref not in present:
                runtime.import_image(image.archive)

    def runtime_images(self) -> set[str]:
        return self.cri.images()

    def remove_image(self, ref: str) -> None:
        """Take an image off the node (containers of it that exist keep their snapshots)."""
        self.cri.remove_image(ref)

    def container(self, pod_uid: str, name: str) -> tuple[dict[str, Any], int]:
        """(OCI spec, pid) of the pod's running container `name`."""
        container_id, pid = self.cri.running_container(pod_uid, name)
        return self.cri.container_spec(container_id), pid

    def pod_netns(self, pod_uid: str) -> str:
        """/proc/<pid>/ns/net of the pod's running sandbox (a process of the pod)."""
        pid = self.cri.sandbox_pid(pod_uid)
        if pid is None:
            raise AssertionError(f"no running sandbox of pod {pod_uid} in the node's runtime")
        return f"/proc/{pid}/ns/net"

    # -- API ---------------------------------------------------------------------------------

    def core(self) -> Any:
        """CoreV1Api as cluster admin (one client for the cluster's lifetime)."""
        if self._api is None:
            self._api = k8s_config.new_client_from_config(  # type: ignore[no-untyped-call]
                config_file=str(self.kubeconfig)
            )
        return k8s.CoreV1Api(self._api)

    def apps(self) -> Any:
        self.core()
        return k8s.AppsV1Api(self._api)

    def node_ready(self) -> bool:
        try:
            node = self.core().read_node(self.node_name)
        except k8s.ApiException as e:
            if e.status == 404:
                return False
            raise
        conditions = {c.type: c.status for c in node.status.conditions or []}
        taints = [t.key for t in node.spec.taints or []]
        return conditions.get("Ready") == "True" and not any(
            t.startswith("node.kubernetes.io/not-ready") for t in taints
        )

    def wait_node_ready(self, timeout: float = READY_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        restarts = 1
        while not self.node_ready():
            if restarts and self._kubelet_hit_go_runtime_race():
                restarts -= 1
                assert self.kubelet is not None
                log.warning("kubelet died of %r starting; started again", KUBELET_RACE)
                self.kubelet.start()
            self.check_alive()
            if time.monotonic() > deadline:
                assert self.kubelet is not None and self.kubelet.daemon is not None
                raise self.kubelet.daemon.failure(
                    f"did not make node {self.node_name} Ready (and untainted) within {timeout}s"
                    f"\n{explain()}"
                )
            time.sleep(0.5)

    def _kubelet_hit_go_runtime_race(self) -> bool:
        daemon = self.kubelet.daemon if self.kubelet else None
        return daemon is not None and not daemon.alive() and KUBELET_RACE in daemon.tail(400)

    def check_alive(self) -> None:
        """Raise naming the first part of the node that exited."""
        for daemon in [
            *(self.plane.daemons if self.plane else []),
            *([self.cri.daemon] if self.runtime else []),
            *([self.kubelet.daemon] if self.kubelet and self.kubelet.daemon else []),
            *(self.services.daemons if self.services else []),
        ]:
            if not daemon.alive():
                raise daemon.failure("is not running")

    def log_paths(self) -> list[Path]:
        return sorted(self.log_dir.glob("*.log")) + sorted(
            (self.workdir / "controlplane" / "logs").glob("*.log")
        )


def _resolved(node_path: str) -> str:
    """/bin is a link to usr/bin on this machine: an overlay goes on the real dir."""
    return str(Path(node_path).resolve())


def _run(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise PartFailedError(f"{' '.join(argv)} failed: {done.stderr.strip()}")
