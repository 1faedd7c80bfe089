"""kubeconfig files for the test bed's API server: one per identity."""

from __future__ import annotations

import os
from pathlib import Path

import yaml


def write_kubeconfig(
    path: Path,
    *,
    server: str,
    ca_file: Path,
    user: str,
    client_cert: Path | None = None,
    client_key: Path | None = None,
    token: str | None = None,
) -> Path:
    """Write a kubeconfig with one cluster, one user and one current context (mode 0600: it may
    hold a bearer token)."""
    credentials: dict[str, str] = {}
    if client_cert is not None and client_key is not None:
        credentials = {"client-certificate": str(client_cert), "client-key": str(client_key)}
    elif token is not None:
        credentials = {"token": token}
    else:
        raise ValueError(f"kubeconfig {path}: need a client certificate and key, or a token")
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "testbed",
                "cluster": {"server": server, "certificate-authority": str(ca_file)},
            }
        ],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": user, "context": {"cluster": "testbed", "user": user}}],
        "current-context": user,
    }
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(config, f, sort_keys=False)
    os.replace(tmp, path)
    return path
