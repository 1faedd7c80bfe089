"""A sidecar istiod injects with the real Envoy (the `proxy-envoy` image: Istio's pilot-agent
running upstream Envoy 1.40), and what the test bed reads of it from the machine:

    pod_annotations()     the pod annotations that ask the injector for that image, with
                          pilot-agent writing the workload certificate it got (OUTPUT_CERTS)
    issued()              that certificate chain and root, read through the container's root
    uri_sans(), verify()  what openssl says of a certificate: its URI SANs; its chain to a root
    admin()               a GET on Envoy's admin API (127.0.0.1:15000 in the pod's netns)
    xds_stats()           Envoy's counters of istiod's CDS and LDS updates, accepted and rejected
    rejections()          Envoy's own lines naming each rejected update, from the container log

Why OUTPUT_CERTS for the certificate: pilot-agent writes what istiod signed as it got it, whether
or not Envoy took any configuration that asks for it over SDS; Envoy's admin /certs shows only
certificates a listener or cluster it accepted refers to.
"""

from __future__ import annotations

import http.client
import json
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.netns import run_in_netns
from testbed.parts import SETUP_APT, MissingPartError
from testbed.realnode import RealCluster

PROXY = "istio-proxy"
CERT_DIR = "/etc/istio/proxy"  # the injected istio-envoy emptyDir: the proxy's user writes it
ADMIN_PORT = 15000
PROXY_IMAGE_ANNOTATION = "sidecar.istio.io/proxyImage"
PROXY_CONFIG_ANNOTATION = "proxy.istio.io/config"
TLS_HANDSHAKES = "ssl.handshake"
XDS_STATS = (
    "cluster_manager.cds.update_success",
    "cluster_manager.cds.update_rejected",
    "listener_manager.lds.update_success",
    "listener_manager.lds.update_rejected",
)
# Envoy: "gRPC config for type.googleapis.com/envoy.config.listener.v3.Listener rejected: ..."
REJECTED_START = re.compile(r"gRPC config for (\S+) rejected: (.*)")
TIMESTAMPED = re.compile(r"\d{4}-\d\d-\d\dT")
THREAD_SUFFIX = re.compile(r"\tthread=\d+$")  # pilot-agent's log format for Envoy appends it


def pod_annotations(
    proxy_image: str, metadata: dict[str, str] | None = None, **extra: str
) -> dict[str, str]:
    """The injector's annotations for an istio-proxy of `proxy_image` whose pilot-agent writes
    its certificate to CERT_DIR, and whose Envoy keeps its TLS handshake counters (Istio's
    bootstrap keeps only the stats it lists); `metadata`: more proxyMetadata (pilot-agent's
    env)."""
    config = {
        "proxyMetadata": {"OUTPUT_CERTS": CERT_DIR, **(metadata or {})},
        "proxyStatsMatcher": {"inclusionSuffixes": [TLS_HANDSHAKES]},
    }
    return {
        PROXY_IMAGE_ANNOTATION: proxy_image,
        PROXY_CONFIG_ANNOTATION: json.dumps(config),
        **extra,
    }


@dataclass(frozen=True)
class Issued:
    chain: str
    """cert-chain.pem: the workload certificate first, then its issuers"""
    root: str
    """root-cert.pem: the root pilot-agent hands Envoy to verify peers (ROOTCA)"""


def issued(cluster: RealCluster, pod_uid: str) -> Issued | None:
    """What pilot-agent wrote to CERT_DIR, read through the running container's root (None
    until both files are there)."""
    try:
        _, pid = cluster.container(pod_uid, PROXY)
    except AssertionError:  # not running (yet)
        return None
    base = Path(f"/proc/{pid}/root{CERT_DIR}")
    try:
        chain = (base / "cert-chain.pem").read_text()
        root = (base / "root-cert.pem").read_text()
    except OSError:
        return None
    return Issued(chain, root) if "BEGIN CERTIFICATE" in chain and root else None


def _openssl() -> str:
    binary = shutil.which("openssl")
    if binary is None:
        raise MissingPartError(f"test bed part 'openssl' is missing; install it with {SETUP_APT}")
    return binary


def uri_sans(pem: str) -> list[str]:
    """The URI SANs of the first certificate in `pem`."""
    done = subprocess.run(
        [_openssl(), "x509", "-noout", "-ext", "subjectAltName"],
        input=pem, capture_output=True, text=True, check=True, timeout=10,
    )  # fmt: skip
    return re.findall(r"URI:([^,\s]+)", done.stdout)


def verify(chain: str, root: str) -> tuple[bool, str]:
    """openssl's verdict on the chain's first certificate against `root` alone (the rest of
    the chain as untrusted intermediates)."""
    with tempfile.TemporaryDirectory() as d:
        leaf, rest, anchor = (Path(d) / n for n in ("leaf.pem", "rest.pem", "root.pem"))
        certs = re.findall(r"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", chain, re.S)
        leaf.write_text(certs[0] + "\n")
        rest.write_text("\n".join(certs[1:]) + "\n")
        anchor.write_text(root)
        argv = [_openssl(), "verify", "-CAfile", str(anchor)]
        if len(certs) > 1:
            argv += ["-untrusted", str(rest)]
        done = subprocess.run(
            [*argv, str(leaf)], capture_output=True, text=True, check=False, timeout=10
        )
        return done.returncode == 0, (done.stdout + done.stderr).strip()


def admin(netns: str, path: str) -> tuple[int, str]:
    """GET `path` on Envoy's admin port in the pod's netns (loopback: never captured)."""

    def get() -> tuple[int, str]:
        conn = http.client.HTTPConnection("127.0.0.1", ADMIN_PORT, timeout=5)
        try:
            conn.request("GET", path)
            response = conn.getresponse()
            return response.status, response.read().decode(errors="replace")
        finally:
            conn.close()

    return run_in_netns(netns, get)


def stats(netns: str, pattern: str) -> dict[str, int]:
    """Envoy's counters and gauges whose names match the regex `pattern`."""
    status, body = admin(netns, f"/stats?filter={pattern}")
    if status != 200:
        raise AssertionError(f"Envoy admin /stats: {status} {body[:500]}")
    found = {}
    for line in body.splitlines():
        name, sep, value = line.partition(": ")
        if sep and value.strip().lstrip("-").isdigit():
            found[name] = int(value)
    return found


def xds_stats(netns: str) -> dict[str, int]:
    names = "|".join(re.escape(n) for n in XDS_STATS)
    got = stats(netns, f"^({names})$")
    return {n: got.get(n, 0) for n in XDS_STATS}


def rejections(log: str) -> list[tuple[str, str]]:
    """(type URL, Envoy's reason) of each rejected update in the istio-proxy log, once each. A
    reason naming several resources runs over lines: up to the `thread=N` that ends Envoy's
    line in pilot-agent's format, or the next timestamped line."""
    seen: dict[tuple[str, str], None] = {}
    lines = log.splitlines()
    for i, line in enumerate(lines):
        match = REJECTED_START.search(line)
        if not match:
            continue
        reason = [match.group(2)]
        for more in lines[i + 1 :]:
            if THREAD_SUFFIX.search(reason[-1]) or TIMESTAMPED.match(more):
                break
            reason.append(more)
        text = THREAD_SUFFIX.sub("", "\n".join(reason)).strip()
        seen[(match.group(1), text)] = None
    return list(seen)


def describe(netns: str, log: str) -> dict[str, Any]:
    """What Envoy made of istiod's configuration, for a failure message or the test's record."""
    try:
        counters: dict[str, int] | str = xds_stats(netns)
    except (OSError, AssertionError) as e:
        counters = f"admin unreachable: {e}"
    return {"xds": counters, "rejected": rejections(log)}
