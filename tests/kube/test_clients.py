"""Loading the Kubernetes client configuration (agent.kube)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import yaml

from agent.errors import ConfigError
from agent.kube import build_clients, load_configuration, rest
from agent.logs import KeyValueFormatter

TOKEN = "sekret-token-must-never-be-logged"


def write_kubeconfig(path: Path, server: str = "https://127.0.0.1:6443") -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": "c", "cluster": {"server": server, "insecure-skip-tls-verify": True}}
                ],
                "users": [{"name": "u", "user": {"token": TOKEN}}],
                "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "ctx",
            }
        )
    )
    return path


def test_kubeconfig_from_env(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    path = write_kubeconfig(tmp_path / "kubeconfig", "https://127.0.0.1:7443")
    configuration = load_configuration({"KUBECONFIG": str(path)})
    assert configuration.host == "https://127.0.0.1:7443"
    assert rest.POOL_SIZE >= 32  # many concurrent ADD lookups
    lines = "\n".join(KeyValueFormatter().format(r) for r in caplog.records)
    assert TOKEN not in lines
    assert "server=https://127.0.0.1:7443" in lines


def test_clients_share_one_api_client(tmp_path: Path) -> None:
    path = write_kubeconfig(tmp_path / "kubeconfig")
    clients = build_clients({"KUBECONFIG": str(path)})
    try:
        assert clients.core.api_client is clients.api
        assert clients.apps.api_client is clients.api
        assert isinstance(clients.api, rest.RestClient)
    finally:
        clients.close()


def test_neither_in_cluster_nor_kubeconfig() -> None:
    with pytest.raises(ConfigError, match="neither KUBERNETES_SERVICE_HOST nor KUBECONFIG"):
        load_configuration({})


def test_missing_kubeconfig_file_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nope.kubeconfig"
    with pytest.raises(ConfigError, match=str(missing)):
        load_configuration({"KUBECONFIG": str(missing)})


def test_in_cluster_wins_over_kubeconfig(tmp_path: Path) -> None:
    path = write_kubeconfig(tmp_path / "kubeconfig")
    # In a pod: the service account is used even when KUBECONFIG is set; this process has
    # no service account files, so loading fails and says it was the in-cluster config.
    with pytest.raises(ConfigError, match="in-cluster"):
        load_configuration({"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBECONFIG": str(path)})
