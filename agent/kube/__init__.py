"""The Kubernetes API: the client configuration (agent.kube.config), the agent's own REST
client (agent.kube.rest), and the one boundary every call goes through (agent.kube.api).

Configuration: in a pod (KUBERNETES_SERVICE_HOST set) the service account is used; elsewhere
(tests, a developer's machine) the file named by $KUBECONFIG. The configuration object is never
logged: it carries the bearer token.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent.config import KubeApiSettings
from agent.kube import rest
from agent.kube.config import Configuration
from agent.kube.config import load_configuration as _load

log = logging.getLogger(__name__)

CONNECTION_POOL_SIZE = rest.POOL_SIZE


@dataclass(frozen=True)
class KubeClients:
    """API objects sharing one connection pool and one credential."""

    api: Any
    """agent.kube.rest.RestClient: the pool, closed by close()."""
    core: Any
    """agent.kube.rest.CoreV1 (kubernetes.client.CoreV1Api's names)."""
    apps: Any
    """agent.kube.rest.AppsV1."""

    def close(self) -> None:
        self.api.close()


def load_configuration(environ: Mapping[str, str] | None = None) -> Configuration:
    """In-cluster in a pod, else from $KUBECONFIG; logs where from (never the credential)."""
    configuration = _load(environ)
    log.info(
        "kubernetes client configured",
        extra={"fields": {"source": configuration.source, "server": configuration.host}},
    )
    return configuration


def build_clients(
    environ: Mapping[str, str] | None = None, *, settings: KubeApiSettings | None = None
) -> KubeClients:
    """Load the configuration and build the core and apps calls over one pool, throttled to
    the settings' `qps` and `burst` (client-go's defaults without settings)."""
    rate = settings or KubeApiSettings()
    client = rest.RestClient(load_configuration(environ), qps=rate.qps, burst=rate.burst)
    return KubeClients(api=client, core=rest.CoreV1(client), apps=rest.AppsV1(client))
