"""The check's reads of the API server, with the operator's kubeconfig.

The kubernetes package makes the connection (not agent.kube, the agent's in-pod client): an
operator's kubeconfig often authenticates through an exec credential plugin
(gke-gcloud-auth-plugin, `aws eks get-token`, kubelogin) and names several contexts, which the
package handles and the agent never needs. Every answer is read as raw JSON. GETs only: the
check changes nothing.

    Unreachable   no answer, or the credential refused: the run stops (exit 2)
    ReadError     one read was refused (403) or failed: the check that needed it warns

Both are AgentErrors kept inside the check (as agent.errors says of each module's control flow).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from agent.errors import AgentError

TIMEOUT = (5.0, 30.0)
PROXY_TIMEOUT = (5.0, 10.0)
"""A pod's port through the API server: it gives up dialling a node long before 30 s."""
PAGE = 500
MAX_TEXT = 64 * 1024


class Unreachable(AgentError):
    """The API server did not answer, or refused the credential."""


class ReadError(AgentError):
    """One read failed; `status` is the HTTP status when the API server answered."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class Cluster(Protocol):
    def get(self, path: str, **query: str) -> dict[str, Any] | None:
        """The object at `path`, None when it does not exist."""

    def items(self, path: str, **query: str) -> list[dict[str, Any]]:
        """Every item of the list at `path` (paged)."""

    def proxy_text(self, path: str) -> tuple[int, str]:
        """(status, body) of a GET through the API server's proxy (a pod's own port)."""


class KubeCluster:
    """Cluster over a kubernetes.client.ApiClient."""

    def __init__(self, api_client: Any) -> None:
        self._api = api_client

    def close(self) -> None:
        self._api.close()

    def get(self, path: str, **query: str) -> dict[str, Any] | None:
        status, body = self._request(path, query)
        if status == 404:
            return None
        if not 200 <= status < 300:
            raise ReadError(f"GET {path}: API server answered {status}: {_reason(body)}", status)
        try:
            data = json.loads(body)
        except ValueError as e:
            raise ReadError(f"GET {path}: the answer is not JSON") from e
        if not isinstance(data, dict):
            raise ReadError(f"GET {path}: the answer is not a JSON object")
        return data

    def items(self, path: str, **query: str) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        page = {**query, "limit": str(PAGE)}
        while True:
            data = self.get(path, **page) or {}
            found.extend(i for i in data.get("items") or [] if isinstance(i, dict))
            token = (data.get("metadata") or {}).get("continue")
            if not token:
                return found
            page["continue"] = str(token)

    def proxy_text(self, path: str) -> tuple[int, str]:
        try:
            status, body = self._request(path, {}, accept="text/plain", timeout=PROXY_TIMEOUT)
        except Unreachable as e:  # the API server answers; the pod behind it did not
            raise ReadError(f"GET {path}: {e}") from e
        return status, body[:MAX_TEXT]

    def _request(
        self,
        path: str,
        query: Mapping[str, str],
        accept: str = "application/json",
        timeout: tuple[float, float] = TIMEOUT,
    ) -> tuple[int, str]:
        from kubernetes.client.exceptions import ApiException

        try:
            status, data = _raw_get(self._api, path, list(query.items()), accept, timeout)
        except ApiException as e:  # kubernetes < 35 raises for an answer other than 2xx
            status, data = int(e.status or 0), e.body or e.reason or ""
        except Exception as e:  # urllib3's and the OS's errors: no answer
            raise Unreachable(f"no answer from the API server: {e}") from e
        text = data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data)
        if status == 401:
            raise Unreachable(f"the API server refused the credential: {_reason(text)}")
        return status, text


def _raw_get(
    api: Any, path: str, query: list[tuple[str, str]], accept: str, timeout: tuple[float, float]
) -> tuple[int, Any]:
    """GET through the kubernetes package's ApiClient, whose calling convention changed in its
    version 35: the answer's status and body, whatever the status."""
    headers = {"Accept": accept}
    if hasattr(api, "param_serialize"):
        method, url, headers, _, _ = api.param_serialize(
            "GET", path, query_params=query, header_params=headers, auth_settings=["BearerToken"]
        )
        response = api.call_api(method, url, header_params=headers, _request_timeout=timeout)
        return int(response.status), response.read()
    response = api.call_api(
        path,
        "GET",
        query_params=query,
        header_params=headers,
        auth_settings=["BearerToken"],
        _preload_content=False,
        _return_http_data_only=True,
        _request_timeout=timeout,
    )
    return int(response.status), response.data


def connect(kubeconfig: str | None, context: str | None) -> KubeCluster:
    """A client for `kubeconfig` (default: $KUBECONFIG, then ~/.kube/config; in a pod without
    either, its ServiceAccount). Raises Unreachable when none can be loaded."""
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    path = kubeconfig or os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")
    try:
        if kubeconfig is None and not _exists(path) and os.environ.get("KUBERNETES_SERVICE_HOST"):
            configuration = client.Configuration()
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            return KubeCluster(client.ApiClient(configuration))
        api = config.new_client_from_config(config_file=path, context=context)  # type: ignore[no-untyped-call]
        return KubeCluster(api)
    except (ConfigException, OSError, ValueError, TypeError) as e:
        raise Unreachable(f"cannot load the kubeconfig {path}: {e}") from e


def _exists(path: str) -> bool:
    return any(Path(p).expanduser().exists() for p in path.split(os.pathsep) if p)


def _reason(body: str) -> str:
    try:
        data = json.loads(body)
    except ValueError:
        return body[:200]
    return str(data.get("message") or data.get("reason") or "")[:300]
