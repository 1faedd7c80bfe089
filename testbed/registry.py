"""An OCI registry for the test bed: Debian's docker-registry (the CNCF distribution registry),
serving TLS with a certificate from the control plane's CA, on the root-namespace end of the
node's veth (`cluster.network.gateway`): this machine (buildah, Helm) and the node's containerd
(in the node's network namespace) both reach it there, and nothing outside does. containerd
trusts it through a hosts.toml in its registry config dir (testbed/containerd.py `certs.d`).

    with running_registry(cluster) as registry:
        registry.address            # "10.x.y.1:PORT"
        registry.ca_file
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

from testbed import pki
from testbed.ports import free_port
from testbed.process import Daemon
from testbed.realnode import RealCluster

BINARY = "/usr/bin/docker-registry"
START_TIMEOUT = 20.0


@dataclass(frozen=True)
class Registry:
    address: str
    ca_file: Path
    log_path: Path


def config(root: Path, address: str, cert: pki.KeyPair) -> dict[str, object]:
    return {
        "version": 0.1,
        "log": {"level": "info"},
        "storage": {"filesystem": {"rootdirectory": str(root)}, "delete": {"enabled": True}},
        "http": {
            "addr": address,
            "tls": {"certificate": str(cert.cert), "key": str(cert.key)},
        },
    }


def trust_in_containerd(cluster: RealCluster, address: str, ca_file: Path) -> Path:
    """hosts.toml for `address` in the node's containerd registry config dir."""
    host_dir = cluster.registry_config_dir / address
    host_dir.mkdir(parents=True, exist_ok=True)
    (host_dir / "hosts.toml").write_text(
        f'server = "https://{address}"\n\n'
        f'[host."https://{address}"]\n'
        '  capabilities = ["pull", "resolve"]\n'
        f'  ca = "{ca_file}"\n'
    )
    return host_dir


@contextlib.contextmanager
def running_registry(cluster: RealCluster, base: Path) -> Iterator[Registry]:
    """Started, answering TLS; stopped, its storage and containerd's trust removed at the end."""
    if not Path(BINARY).exists():
        raise AssertionError(f"{BINARY} missing: run ci/setup-apt (Debian's docker-registry)")
    assert cluster.plane is not None and cluster.plane.ca is not None, "the cluster is not started"
    ca = cluster.plane.ca
    host = cluster.network.gateway
    address = f"{host}:{free_port()}"
    base.mkdir(parents=True, exist_ok=True)
    cert = pki.issue(ca, base, "registry", common_name=host, server_ips=[host])
    config_path = base / "config.yml"
    config_path.write_text(yaml.safe_dump(config(base / "storage", address, cert)))
    daemon = Daemon("docker-registry", [BINARY, "serve", str(config_path)], base / "registry.log")
    host_dir = trust_in_containerd(cluster, address, ca.cert)
    daemon.start()
    try:
        _wait_tls(host, int(address.rsplit(":", 1)[1]), ca.cert, daemon)
        yield Registry(address, ca.cert, daemon.log_path)
    finally:
        daemon.stop()
        shutil.rmtree(host_dir, ignore_errors=True)
        shutil.rmtree(base / "storage", ignore_errors=True)


def _wait_tls(host: str, port: int, ca_file: Path, daemon: Daemon) -> None:
    context = ssl.create_default_context(cafile=str(ca_file))
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if not daemon.alive():
            raise daemon.failure("docker-registry exited")
        try:
            with (
                socket.create_connection((host, port), timeout=1) as raw,
                context.wrap_socket(raw, server_hostname=host),
            ):
                return
        except OSError:
            time.sleep(0.2)
    raise daemon.failure(f"docker-registry not serving TLS on {host}:{port}")
