"""Where the API server is and who the agent is to it (agent.kube.config): in a pod from its
ServiceAccount's files, elsewhere from a kubeconfig, each credential form it may hold."""

from __future__ import annotations

import base64
import ssl
from collections.abc import Mapping
from pathlib import Path

import pytest
import yaml

from agent.errors import ConfigError
from agent.kube import config
from testbed import pki


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> tuple[pki.KeyPair, pki.KeyPair]:
    directory = tmp_path_factory.mktemp("pki")
    ca = pki.make_ca(directory)
    return ca, pki.issue(ca, directory, "client", common_name="someone")


def kubeconfig(path: Path, cluster: Mapping[str, object], user: Mapping[str, object]) -> Path:
    data = {
        "clusters": [{"name": "c", "cluster": {"server": "https://10.0.0.1:6443", **cluster}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path.write_text(yaml.safe_dump(data))
    return path


def test_in_cluster_reads_the_service_accounts_files(
    tmp_path: Path, certs: tuple[pki.KeyPair, pki.KeyPair], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "ca.crt").write_bytes(certs[0].cert.read_bytes())
    (tmp_path / "token").write_text("first\n")
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    made = config.in_cluster(env, tmp_path)
    assert made.host == "https://[fd00::1]:443"
    assert made.ssl_context.verify_mode == ssl.CERT_REQUIRED
    assert made.token is not None and made.token() == "first"
    (tmp_path / "token").write_text("rotated\n")  # kubelet rotates the projected token
    assert made.token() == "first"  # read again only after TOKEN_REREAD_SECONDS
    monkeypatch.setattr(config, "TOKEN_REREAD_SECONDS", 0.0)
    assert made.token() == "rotated"
    assert "first" not in repr(made) and "rotated" not in repr(made)


def test_in_cluster_without_files_says_so(tmp_path: Path) -> None:
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    with pytest.raises(ConfigError, match="in-cluster"):
        config.in_cluster(env, tmp_path)


def test_a_client_certificate_as_files_or_data(
    tmp_path: Path, certs: tuple[pki.KeyPair, pki.KeyPair]
) -> None:
    ca, client = certs
    files = kubeconfig(
        tmp_path / "files",
        {"certificate-authority": str(ca.cert)},
        {"client-certificate": str(client.cert), "client-key": str(client.key)},
    )
    made = config.from_kubeconfig(files)
    assert made.host == "https://10.0.0.1:6443" and made.token is None
    data = {
        "client-certificate-data": base64.b64encode(client.cert.read_bytes()).decode(),
        "client-key-data": base64.b64encode(client.key.read_bytes()).decode(),
    }
    ca_data = {"certificate-authority-data": base64.b64encode(ca.cert.read_bytes()).decode()}
    assert config.from_kubeconfig(kubeconfig(tmp_path / "data", ca_data, data)).token is None


def test_a_token_file_relative_to_the_kubeconfig(tmp_path: Path) -> None:
    (tmp_path / "tok").write_text("from-file")
    path = kubeconfig(tmp_path / "k", {"insecure-skip-tls-verify": True}, {"tokenFile": "tok"})
    made = config.from_kubeconfig(path)
    assert made.token is not None and made.token() == "from-file"
    assert made.ssl_context.verify_mode == ssl.CERT_NONE


@pytest.mark.parametrize(
    ("cluster", "user", "error"),
    [
        ({"server": "http://10.0.0.1"}, {}, "not an https:// URL"),
        ({"certificate-authority": "/nonexistent/ca.crt"}, {}, "TLS"),
    ],
    ids=["plain-http", "missing-ca"],
)
def test_a_kubeconfig_that_cannot_work_is_refused(
    tmp_path: Path, cluster: dict[str, object], user: dict[str, object], error: str
) -> None:
    with pytest.raises(ConfigError, match=error):
        config.from_kubeconfig(kubeconfig(tmp_path / "k", cluster, user))


def test_a_context_that_is_not_there_is_named(tmp_path: Path) -> None:
    path = tmp_path / "k"
    path.write_text(yaml.safe_dump({"current-context": "gone", "contexts": []}))
    with pytest.raises(ConfigError, match="no context named 'gone'"):
        config.from_kubeconfig(path)
