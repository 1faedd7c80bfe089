"""What testbed/istio_sidecar.py reads of a sidecar: the SPIFFE ID in a workload certificate, its
chain to a root (openssl), Envoy's rejection lines, and the annotations it asks the injector for."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from testbed import istio_sidecar, pki

SPIFFE = "spiffe://cluster.local/ns/meshed/sa/web-identity"


def workload_cert(ca: pki.KeyPair, directory: Path) -> str:
    """A leaf as istiod signs one: no subject, the SPIFFE ID as its only (URI) SAN."""
    key, csr, cert = directory / "w.key", directory / "w.csr", directory / "w.crt"
    ext = directory / "w.ext"
    ext.write_text(f"subjectAltName=critical,URI:{SPIFFE}\n")
    for argv in (
        ["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(key)],
        ["req", "-new", "-key", str(key), "-subj", "/O=", "-out", str(csr)],
        ["x509", "-req", "-in", str(csr), "-CA", str(ca.cert), "-CAkey", str(ca.key),
         "-CAcreateserial", "-days", "1", "-extfile", str(ext), "-out", str(cert)],
    ):  # fmt: skip
        subprocess.run(["openssl", *argv], cwd=directory, check=True, capture_output=True)
    return cert.read_text()


def test_the_spiffe_id_and_the_chain_to_its_root_only(tmp_path: Path) -> None:
    root = pki.make_ca(tmp_path, "root")
    other_dir = tmp_path / "other"
    other_dir.mkdir()
    other = pki.make_ca(other_dir, "other")
    chain = workload_cert(root, tmp_path) + root.cert.read_text()
    assert istio_sidecar.uri_sans(chain) == [SPIFFE]
    ok, verdict = istio_sidecar.verify(chain, root.cert.read_text())
    assert ok, verdict
    ok, verdict = istio_sidecar.verify(chain, other.cert.read_text())
    assert not ok, verdict


def test_rejections_are_read_once_each_with_envoys_reason() -> None:
    line = (
        "2026-12-07T07:00:00.000000Z\twarning\tenvoy config external/envoy/source/extensions/"
        "config_subscription/grpc/grpc_subscription_impl.cc:138\tgRPC config for "
        "type.googleapis.com/envoy.config.cluster.v3.Cluster rejected: Didn't find a registered "
        "implementation for 'istio.metadata_exchange'\tthread=15"
    )
    log = "\n".join([line, "info\tsomething else", line])
    assert istio_sidecar.rejections(log) == [
        (
            "type.googleapis.com/envoy.config.cluster.v3.Cluster",
            "Didn't find a registered implementation for 'istio.metadata_exchange'",
        )
    ]
    assert istio_sidecar.rejections("info\tall accepted") == []


def test_the_annotations_ask_for_the_image_and_the_certificate_files() -> None:
    got = istio_sidecar.pod_annotations("hub/proxy-envoy:1", {"ISTIO_META_DNS_CAPTURE": "true"})
    assert got[istio_sidecar.PROXY_IMAGE_ANNOTATION] == "hub/proxy-envoy:1"
    config = json.loads(got[istio_sidecar.PROXY_CONFIG_ANNOTATION])
    assert config == {
        "proxyMetadata": {
            "OUTPUT_CERTS": istio_sidecar.CERT_DIR,
            "ISTIO_META_DNS_CAPTURE": "true",
        },
        "proxyStatsMatcher": {"inclusionSuffixes": ["ssl.handshake"]},
    }


def test_a_rejection_over_several_lines_is_read_whole() -> None:
    log = (
        "2026-12-07T07:00:00.000000Z\twarning\tenvoy config x.cc:1\tgRPC config for "
        "type.googleapis.com/envoy.config.listener.v3.Listener rejected: Error adding/updating "
        "listener(s) virtualInbound: unknown 'istio.alpn'\n"
        "virtualOutbound: unknown 'istio.stats'\n"
        "\tthread=15\n"
        "2026-12-07T07:00:01.000000Z\tinfo\tsomething else\n"
    )
    [(_, reason)] = istio_sidecar.rejections(log)
    assert reason == (
        "Error adding/updating listener(s) virtualInbound: unknown 'istio.alpn'\n"
        "virtualOutbound: unknown 'istio.stats'"
    )
