"""A CNI runtime for one simulated node: a "node" network namespace, a CNI conf dir and bin dir,
and cnitool driving ADD / CHECK / DEL for pod network namespaces with the CNI_ARGS a Kubernetes
container runtime passes.

The reference conflist is bridge + host-local + portmap. cnitool runs inside the node netns
(`ip netns exec`), so the bridge, the host ends of the veths and portmap's rules live there and
the machine's own network is never touched.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import subprocess
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testbed import netns

log = logging.getLogger(__name__)

# Where libcni (inside cnitool) caches results; entries are named <network>-<containerid>-<if>.
LIBCNI_CACHE = Path("/var/lib/cni/results")
DEFAULT_SUBNET = "10.250.0.0/24"


def bridge_plugin(bridge: str, subnet: str, ipam_dir: Path | None = None) -> dict[str, Any]:
    """The test bed's pod network: bridge + host-local, a default route via the bridge
    (host-local's default dataDir when `ipam_dir` is None)."""
    ipam: dict[str, Any] = {
        "type": "host-local",
        "ranges": [[{"subnet": subnet}]],
        "routes": [{"dst": "0.0.0.0/0"}],
    }
    if ipam_dir is not None:
        ipam["dataDir"] = str(ipam_dir)
    return {
        "type": "bridge",
        "bridge": bridge,
        "isGateway": True,
        "ipMasq": False,
        "hairpinMode": True,
        "ipam": ipam,
    }


def reference_conflist(network: str, bridge: str, subnet: str, ipam_dir: Path) -> dict[str, Any]:
    """bridge + host-local + portmap: the pod network of a test bed node."""
    return {
        "cniVersion": "1.0.0",
        "name": network,
        "plugins": [
            bridge_plugin(bridge, subnet, ipam_dir),
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def link_plugins(plugins_dir: Path, bin_dir: Path) -> None:
    """Symlinks: the plugins stay Debian's, and the bin dir stays writable for installers."""
    for plugin in sorted(plugins_dir.iterdir()):
        if plugin.is_file() and os.access(plugin, os.X_OK):
            (bin_dir / plugin.name).symlink_to(plugin)


@dataclass(frozen=True)
class Sandbox:
    """A pod sandbox as the runtime sees it: its netns and the pod it belongs to."""

    netns_name: str
    netns_path: Path
    pod_name: str
    pod_namespace: str
    pod_uid: str
    infra_container_id: str

    def cni_args(self) -> str:
        # IgnoreUnknown=1 first, as containerd and CRI-O send it, so plugins accept K8S_* keys.
        return (
            f"IgnoreUnknown=1;K8S_POD_NAMESPACE={self.pod_namespace};"
            f"K8S_POD_NAME={self.pod_name};"
            f"K8S_POD_INFRA_CONTAINER_ID={self.infra_container_id};K8S_POD_UID={self.pod_uid}"
        )


@dataclass(frozen=True)
class CniResult:
    command: str
    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def json(self) -> dict[str, Any]:
        """The result (ADD) or CNI error object cnitool printed on stdout."""
        return dict(json.loads(self.stdout)) if self.stdout.strip() else {}


class CniCommandError(RuntimeError):
    def __init__(self, result: CniResult, argv: list[str]) -> None:
        super().__init__(
            f"cnitool {result.command} failed ({result.returncode}): {' '.join(argv)}\n"
            f"stdout: {result.stdout.strip()}\nstderr: {result.stderr.strip()}"
        )
        self.result = result


@dataclass
class CniNode:
    """Use start() then close() (idempotent; removes everything it made even after failures)."""

    workdir: Path
    cnitool: Path
    plugins_dir: Path
    subnet: str = DEFAULT_SUBNET
    netns_name: str = field(default_factory=lambda: netns.unique_name("tb-node"))
    network: str = field(default_factory=lambda: netns.unique_name("testbed"))
    bridge: str = field(default_factory=lambda: f"tbbr{secrets.token_hex(4)}")
    sandboxes: list[Sandbox] = field(default_factory=list)

    @property
    def conf_dir(self) -> Path:
        return self.workdir / "net.d"

    @property
    def bin_dir(self) -> Path:
        return self.workdir / "bin"

    @property
    def conflist_path(self) -> Path:
        return self.conf_dir / f"10-{self.network}.conflist"

    def reference_conflist(self) -> dict[str, Any]:
        return reference_conflist(self.network, self.bridge, self.subnet, self.workdir / "ipam")

    def start(self) -> None:
        for d in (self.conf_dir, self.bin_dir):
            d.mkdir(parents=True, exist_ok=True)
        link_plugins(self.plugins_dir, self.bin_dir)
        self.conflist_path.write_text(json.dumps(self.reference_conflist(), indent=2) + "\n")
        netns.add(self.netns_name)

    def new_sandbox(self, pod_name: str, pod_namespace: str, pod_uid: str | None = None) -> Sandbox:
        """A fresh pod netns (loopback up), as the runtime makes before calling ADD."""
        name = netns.unique_name("tb-pod")
        path = netns.add(name)
        sandbox = Sandbox(
            netns_name=name,
            netns_path=path,
            pod_name=pod_name,
            pod_namespace=pod_namespace,
            pod_uid=pod_uid or str(uuid.uuid4()),
            infra_container_id=secrets.token_hex(32),
        )
        self.sandboxes.append(sandbox)
        return sandbox

    def run(
        self,
        command: str,
        sandbox: Sandbox,
        *,
        ifname: str = "eth0",
        check: bool = True,
        timeout: float = 60.0,
    ) -> CniResult:
        """cnitool <command> for the sandbox, inside the node netns. `command`: ADD, CHECK, DEL."""
        argv = [
            "ip",
            "netns",
            "exec",
            self.netns_name,
            str(self.cnitool),
            command.lower(),
            self.network,
            str(sandbox.netns_path),
        ]
        env = {
            "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
            "NETCONFPATH": str(self.conf_dir),
            "CNI_PATH": str(self.bin_dir),
            "CNI_ARGS": sandbox.cni_args(),
            "CNI_IFNAME": ifname,
        }
        proc = subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
        result = CniResult(command.upper(), proc.returncode, proc.stdout, proc.stderr)
        if check and not result.ok:
            raise CniCommandError(result, argv)
        return result

    def add(self, sandbox: Sandbox) -> dict[str, Any]:
        return self.run("ADD", sandbox).json()

    def check(self, sandbox: Sandbox) -> None:
        self.run("CHECK", sandbox)

    def delete(self, sandbox: Sandbox) -> None:
        self.run("DEL", sandbox)

    def remove_sandbox(self, sandbox: Sandbox) -> None:
        """Delete the pod netns (with its end of the veth), as the runtime does after DEL."""
        netns.delete(sandbox.netns_name)
        if sandbox in self.sandboxes:
            self.sandboxes.remove(sandbox)

    def close(self) -> None:
        """Remove every pod netns, the node netns (bridge, veths, portmap rules with it), and
        libcni's cached results for this network. Collects errors and raises them together."""
        errors: list[str] = []
        for sandbox in list(self.sandboxes):
            try:
                self.remove_sandbox(sandbox)
            except Exception as e:  # keep going: the rest must still be removed
                errors.append(f"pod netns {sandbox.netns_name}: {e}")
        try:
            netns.delete(self.netns_name)
        except Exception as e:
            errors.append(f"node netns {self.netns_name}: {e}")
        for cached in LIBCNI_CACHE.glob(f"{self.network}-*"):
            cached.unlink(missing_ok=True)
        shutil.rmtree(self.workdir / "ipam", ignore_errors=True)
        if errors:
            raise RuntimeError("CNI node cleanup: " + "; ".join(errors))
