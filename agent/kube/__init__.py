"""The Kubernetes API: the client configuration and API objects (here), and the one boundary
every call goes through (agent.kube.api).

Configuration: in a pod (KUBERNETES_SERVICE_HOST set) the service account is used; elsewhere
(tests, a developer's machine) the file named by $KUBECONFIG. The configuration object is never
logged: it carries the bearer token.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client as k8s
from kubernetes import config as k8s_config

from agent.errors import ConfigError

log = logging.getLogger(__name__)

# Pod lookups of many concurrent ADDs share the pool; the default (cores * 5) is small.
CONNECTION_POOL_SIZE = 32


@dataclass(frozen=True)
class KubeClients:
    """API objects sharing one connection pool and one credential."""

    api: Any
    """kubernetes.client.ApiClient: for raw calls and closing the pool."""
    core: Any
    """kubernetes.client.CoreV1Api."""
    apps: Any
    """kubernetes.client.AppsV1Api."""

    def close(self) -> None:
        self.api.close()


def load_configuration(environ: Mapping[str, str] | None = None) -> Any:
    """A fresh kubernetes.client.Configuration: in-cluster in a pod, else from $KUBECONFIG."""
    env = os.environ if environ is None else environ
    configuration = k8s.Configuration()
    if env.get("KUBERNETES_SERVICE_HOST"):
        try:
            k8s_config.load_incluster_config(  # type: ignore[no-untyped-call]  # untyped lib
                client_configuration=configuration
            )
        except k8s_config.ConfigException as e:
            raise ConfigError(f"in-cluster Kubernetes config: {e}") from e
        source = "in-cluster service account"
    else:
        path = env.get("KUBECONFIG", "")
        if not path:
            raise ConfigError(
                "Kubernetes client config: neither KUBERNETES_SERVICE_HOST nor KUBECONFIG is set"
            )
        try:
            k8s_config.load_kube_config(  # type: ignore[no-untyped-call]  # untyped lib
                config_file=path, client_configuration=configuration, persist_config=False
            )
        except (k8s_config.ConfigException, OSError) as e:
            raise ConfigError(f"Kubernetes client config {path}: {e}") from e
        source = path
    configuration.connection_pool_maxsize = CONNECTION_POOL_SIZE
    log.info(
        "kubernetes client configured",
        extra={"fields": {"source": source, "server": configuration.host}},
    )
    return configuration


def build_clients(environ: Mapping[str, str] | None = None) -> KubeClients:
    """Load the configuration and build CoreV1Api and AppsV1Api over one ApiClient."""
    api = k8s.ApiClient(configuration=load_configuration(environ))
    return KubeClients(api=api, core=k8s.CoreV1Api(api), apps=k8s.AppsV1Api(api))
