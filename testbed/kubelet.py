"""kubelet for a real node of the test bed: its certificates from the test bed's CA, its
KubeletConfiguration for this machine, and the process (in the node netns).

Settings this machine needs (cgroup v1, no CAP_SYS_RESOURCE games, no systemd, a shared disk):
cgroupfs without node-allocatable enforcement, cgroup v1 allowed, no swap check, no eviction and
no image GC (imported images must never be removed: nothing can be pulled back). Pods get their
cgroups as on any node (`kubepods/<qos>/pod<uid>/<container>`: the agent finds a pod's network
namespace by them), under a cgroup root of this node's own (`cgroup_root`) that its clean-up
removes. The API server reaches it with a client certificate of the same CA (pod logs).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from testbed import parts, pki
from testbed.kubeconfig import write_kubeconfig
from testbed.process import Daemon

PORT = 10250
# Evaluating no eviction signal: "0%" is how a threshold is switched off.
NO_EVICTION = {
    s: "0%"
    for s in (
        "memory.available",
        "nodefs.available",
        "nodefs.inodesFree",
        "imagefs.available",
        "imagefs.inodesFree",
    )
}


@dataclass(frozen=True)
class KubeletDirs:
    base: Path

    @property
    def root(self) -> Path:
        """--root-dir: pods' volumes, plugins, checkpoints."""
        return self.base / "root"

    @property
    def pod_logs(self) -> Path:
        return self.base / "pod-logs"

    @property
    def pki(self) -> Path:
        return self.base / "pki"

    @property
    def config(self) -> Path:
        return self.base / "config.yaml"

    @property
    def kubeconfig(self) -> Path:
        return self.base / "kubelet.kubeconfig"


def kubelet_configuration(
    *,
    runtime_socket: Path,
    ca_file: Path,
    serving: pki.KeyPair,
    pod_logs: Path,
    address: str,
    cgroup_root: str,
    max_pods: int = 110,
    register_taints: tuple[str, ...] = (),
    cluster_dns: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """`register_taints`: `key=value:Effect` (or `key:Effect`), as --register-with-taints.
    `cluster_dns`: (the cluster DNS Service's IP, the cluster domain) pods resolve with."""
    taints = []
    for taint in register_taints:
        key_value, effect = taint.rsplit(":", 1)
        key, _, value = key_value.partition("=")
        taints.append(
            {"key": key, "value": value, "effect": effect}
            if value
            else {"key": key, "effect": effect}
        )
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "containerRuntimeEndpoint": f"unix://{runtime_socket}",
        # cgroup v1 and no systemd on this machine.
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupsPerQOS": True,
        "cgroupRoot": cgroup_root,
        "enforceNodeAllocatable": [],
        "failSwapOn": False,
        "evictionHard": NO_EVICTION,
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "podLogsDir": str(pod_logs),
        # No host resolver for pods; cluster DNS only on a node with Services (services.py).
        "resolvConf": "",
        **(
            {"clusterDNS": [cluster_dns[0]], "clusterDomain": cluster_dns[1]} if cluster_dns else {}
        ),
        "address": address,
        "port": PORT,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "tlsCertFile": str(serving.cert),
        "tlsPrivateKeyFile": str(serving.key),
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
        # Only clients with a certificate of the cluster CA (the API server) get in.
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(ca_file)},
        },
        "authorization": {"mode": "AlwaysAllow"},
        # Status soon after start and after a restart; tests wait for Ready.
        "nodeStatusUpdateFrequency": "2s",
        "syncFrequency": "10s",
        "maxPods": max_pods,
        "registerWithTaints": taints,
    }


class Kubelet:
    """Certificates and config are made by prepare(); start()/stop() the process (stop leaves
    the pods running, as a kubelet restart on a node does)."""

    def __init__(
        self,
        dirs: KubeletDirs,
        *,
        node_name: str,
        node_ip: str,
        server: str,
        ca: pki.KeyPair,
        runtime_socket: Path,
        prefix: list[str],
        log_path: Path,
        cgroup_root: str,
        max_pods: int = 110,
        register_taints: tuple[str, ...] = (),
        kube: parts.Kube | None = None,
        cluster_dns: tuple[str, str] | None = None,
    ) -> None:
        """`max_pods`: kubelet's limit (its default, 110, unless a benchmark fills a node with
        more beside the DaemonSet's pod). `register_taints`: the Node's taints at registration.
        `kube`: the release whose kubelet runs (the test bed's by default). `cluster_dns`: (DNS
        Service IP, cluster domain) for pods, else pods resolve nothing."""
        self.register_taints = register_taints
        self.cluster_dns = cluster_dns
        self.binary = (kube or parts.kube()).part("kubelet").require()
        self.max_pods = max_pods
        self.cgroup_root = cgroup_root
        self.dirs = dirs
        self.node_name = node_name
        self.node_ip = node_ip
        self.server = server
        self.ca = ca
        self.runtime_socket = runtime_socket
        self.prefix = prefix
        self.log_path = log_path
        self.daemon: Daemon | None = None
        self.serving: pki.KeyPair | None = None
        self.starts = 0

    def prepare(self) -> None:
        for d in (self.dirs.root, self.dirs.pod_logs, self.dirs.pki):
            d.mkdir(parents=True, exist_ok=True)
        client = pki.issue(
            self.ca,
            self.dirs.pki,
            "client",
            common_name=f"system:node:{self.node_name}",
            organizations=["system:nodes"],
        )
        self.serving = pki.issue(
            self.ca,
            self.dirs.pki,
            "serving",
            common_name=self.node_name,
            server_names=[self.node_name],
            server_ips=[self.node_ip],
        )
        write_kubeconfig(
            self.dirs.kubeconfig,
            server=self.server,
            ca_file=self.ca.cert,
            user=f"system:node:{self.node_name}",
            client_cert=client.cert,
            client_key=client.key,
        )
        self.write_config()

    def write_config(self) -> None:
        """The KubeletConfiguration (again after `runtime_socket` changed: the node's certificates
        from prepare() stay)."""
        assert self.serving is not None, "prepare() first"
        config = kubelet_configuration(
            runtime_socket=self.runtime_socket,
            ca_file=self.ca.cert,
            serving=self.serving,
            pod_logs=self.dirs.pod_logs,
            address=self.node_ip,
            cgroup_root=self.cgroup_root,
            max_pods=self.max_pods,
            register_taints=self.register_taints,
            cluster_dns=self.cluster_dns,
        )
        self.dirs.config.write_text(yaml.safe_dump(config, sort_keys=False))

    def start(self) -> None:
        self.starts += 1
        log = self.log_path.with_suffix(f".{self.starts}.log") if self.starts > 1 else self.log_path
        self.daemon = Daemon(
            "kubelet",
            [
                *self.prefix,
                str(self.binary),
                f"--config={self.dirs.config}",
                f"--kubeconfig={self.dirs.kubeconfig}",
                f"--root-dir={self.dirs.root}",
                f"--hostname-override={self.node_name}",
                f"--node-ip={self.node_ip}",
                "--v=2",
            ],
            log,
        )
        self.daemon.start()

    def alive(self) -> bool:
        return self.daemon is not None and self.daemon.alive()

    def stop(self) -> None:
        if self.daemon is not None:
            self.daemon.stop()
