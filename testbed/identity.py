"""Identities for processes under test: a ServiceAccount token from the TokenRequest API (what
the kubelet mounts into a pod) written into a kubeconfig, so the process holds exactly the RBAC
of that ServiceAccount."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.kubeconfig import write_kubeconfig


@dataclass(frozen=True)
class Identity:
    username: str
    """As the API server sees it: system:serviceaccount:<namespace>:<name>."""
    kubeconfig: Path
    token: str


def service_account_identity(
    core: Any,
    *,
    namespace: str,
    service_account: str,
    server: str,
    ca_file: Path,
    path: Path,
    expiration_seconds: int = 3600,
    bound_pod: tuple[str, str] | None = None,
) -> Identity:
    """Request a token for namespace/service_account (optionally bound to a pod (name, uid), as
    a kubelet-projected token is) and write a kubeconfig using it at `path`."""
    spec: dict[str, Any] = {"audiences": [], "expirationSeconds": expiration_seconds}
    if bound_pod is not None:
        spec["boundObjectRef"] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": bound_pod[0],
            "uid": bound_pod[1],
        }
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
    answer = core.create_namespaced_service_account_token(service_account, namespace, request)
    token = answer.status.token
    username = f"system:serviceaccount:{namespace}:{service_account}"
    write_kubeconfig(path, server=server, ca_file=ca_file, user=username, token=token)
    return Identity(username=username, kubeconfig=path, token=token)
