"""The agent's own Kubernetes REST client: the dozen calls it makes, over one urllib3 pool.

Why not the kubernetes package: importing it loads every API model, its dynamic client, a
JSON-schema validator and pydantic (about 25 MiB of the agent's RSS and most of a second of
CPU at start), and its models, which the agent never reads: every answer is read as raw JSON
(agent.kube.api). The calls keep the kubernetes client's names and keyword arguments
(`field_selector`, `_preload_content`, `_request_timeout`, ...), so callers and tests can hand
either client to the caches and services.

An answer other than 2xx raises ApiError (status, reason, body); a call that got no answer
raises urllib3's or the OS's own error; agent.kube.api turns both into the agent's errors.

As client-go's rest client: every call waits its turn (agent.kube.throttle: QPS and burst, and
the API server's Retry-After); a 429 or 5xx with Retry-After is sent again after that wait while
the call's timeout allows (at most MAX_RETRIES times); a 401 re-reads the token file at once
(at most every TOKEN_RETRY_SECONDS) and, when the token changed, sends the call again. The pool
keeps POOL_SIZE connections and makes a caller wait for a free one rather than open one it would
throw away; its sockets send TCP keepalives, so a peer that vanished is noticed without traffic.
"""

from __future__ import annotations

import json
import socket
import time
from typing import Any
from urllib.parse import quote, urlencode

import urllib3
from urllib3.connection import HTTPConnection

from agent.errors import AgentError
from agent.kube.config import Configuration
from agent.kube.throttle import DEFAULT_BURST, DEFAULT_QPS, Throttle, retry_after

POOL_SIZE = 32
"""Connections kept to the API server: pod lookups of many concurrent ADDs share the pool; a
call finding them all busy waits for one (up to its time to connect) instead of opening one
that would be discarded after use."""
MAX_RETRIES = 10
"""Sends again of one call after a Retry-After (client-go's default)."""
KEEPALIVE_IDLE_SECONDS, KEEPALIVE_INTERVAL_SECONDS, KEEPALIVE_PROBES = 30, 10, 3
"""TCP keepalive: first probe after 30 s without traffic (Go's dialer, which client-go uses,
probes every 30 s), then every 10 s; 3 unanswered probes close the socket, so a silent peer on
an idle connection is noticed in about a minute."""
SOCKET_OPTIONS = [
    *HTTPConnection.default_socket_options,
    (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1),
    (socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, KEEPALIVE_IDLE_SECONDS),
    (socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, KEEPALIVE_INTERVAL_SECONDS),
    (socket.IPPROTO_TCP, socket.TCP_KEEPCNT, KEEPALIVE_PROBES),
]
DEFAULT_TIMEOUT = (5.0, 30.0)
MERGE_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
USER_AGENT = "istio-cni-agent"

QUERY_NAMES = {
    "field_selector": "fieldSelector",
    "label_selector": "labelSelector",
    "limit": "limit",
    "_continue": "continue",
    "watch": "watch",
    "allow_watch_bookmarks": "allowWatchBookmarks",
    "resource_version": "resourceVersion",
    "timeout_seconds": "timeoutSeconds",
    "grace_period_seconds": "gracePeriodSeconds",
}


class ApiError(AgentError):
    """The API server answered, with a status other than 2xx (agent.kube.api turns it into the
    KubeApiError of its status)."""

    retry_later = True

    def __init__(self, status: int, reason: str, body: bytes = b"") -> None:
        super().__init__(f"({status}) Reason: {reason}")
        self.status, self.reason, self.body = status, reason, body.decode("utf-8", "replace")


class RestClient:
    """One connection pool, credential and throttle; `request` is every call's one way out."""

    def __init__(
        self, configuration: Configuration, *, qps: float = DEFAULT_QPS, burst: int = DEFAULT_BURST
    ) -> None:
        self.configuration = configuration
        self.throttle = Throttle(qps, burst)
        self._pool = urllib3.PoolManager(
            num_pools=2,
            maxsize=POOL_SIZE,
            block=True,
            ssl_context=configuration.ssl_context,
            socket_options=SOCKET_OPTIONS,
        )

    def close(self) -> None:
        self._pool.clear()

    def request(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        options: dict[str, Any] | None = None,
    ) -> Any:
        """`options`: the client's keyword arguments (query parameters by their Python names,
        `_preload_content`, `_request_timeout`, `_content_type`)."""
        opts = dict(options or {})
        preload = bool(opts.pop("_preload_content", True))
        timeout = opts.pop("_request_timeout", None) or DEFAULT_TIMEOUT
        content_type = opts.pop("_content_type", None) or content_type
        params = dict(query or {})
        for name, value in opts.items():
            if name not in QUERY_NAMES:
                raise TypeError(f"unexpected keyword argument {name!r}")
            if value is not None:
                params[QUERY_NAMES[name]] = _query_value(value)
        url = self.configuration.host + path + (f"?{urlencode(params)}" if params else "")
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        data = None
        if body is not None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            headers["Content-Type"] = content_type
        response = self._send(method, url, data, headers, timeout)
        if not 200 <= response.status < 300:
            try:
                text = response.read()
            finally:
                response.release_conn()
            raise ApiError(response.status, response.reason or "", text)
        if preload:
            try:
                response.read()  # kept in .data
            finally:
                response.release_conn()
        return response

    def _send(
        self, method: str, url: str, data: bytes | None, headers: dict[str, str], timeout: Any
    ) -> Any:
        """Send when the throttle allows, again after a Retry-After or a re-read token while the
        call's timeout allows; the last answer, whatever its status."""
        t = _timeout(timeout)
        pool_wait, budget = timeout if isinstance(timeout, tuple) else (timeout, timeout)
        started, refreshed, attempt = time.monotonic(), False, 0
        token = self.configuration.token
        while True:
            left = budget - (time.monotonic() - started)
            self.throttle.wait_turn(max(0.0, left))
            if token is not None:
                headers["Authorization"] = f"Bearer {token()}"
            response = self._pool.request(
                method,
                url,
                body=data,
                headers=headers,
                timeout=t,
                preload_content=False,
                retries=False,
                pool_timeout=pool_wait,
            )
            wait = retry_after(response.status, response.headers)
            if wait is not None:
                self.throttle.hold_off(wait)
            again = (
                wait is not None
                and attempt < MAX_RETRIES
                and time.monotonic() - started + wait <= budget
            )
            if response.status == 401 and token is not None and not refreshed:
                again = refreshed = token.refresh()
            if not again:
                return response
            attempt += 1
            response.drain_conn()
            response.release_conn()


def _query_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _timeout(value: Any) -> urllib3.Timeout:
    if isinstance(value, tuple):
        return urllib3.Timeout(connect=value[0], read=value[1])
    return urllib3.Timeout(total=float(value))


def _patch_type(body: Any) -> str:
    return JSON_PATCH if isinstance(body, list) else MERGE_PATCH


def _segment(value: str) -> str:
    return quote(str(value), safe="")


class CoreV1:
    """The core/v1 calls the agent makes, named as kubernetes.client.CoreV1Api's."""

    def __init__(self, client: RestClient) -> None:
        self.api_client = client

    def list_pod_for_all_namespaces(self, **kw: Any) -> Any:
        return self.api_client.request("GET", "/api/v1/pods", options=kw)

    def read_namespaced_pod(self, name: str, namespace: str, **kw: Any) -> Any:
        path = f"/api/v1/namespaces/{_segment(namespace)}/pods/{_segment(name)}"
        return self.api_client.request("GET", path, options=kw)

    def patch_namespaced_pod_status(self, name: str, namespace: str, body: Any, **kw: Any) -> Any:
        path = f"/api/v1/namespaces/{_segment(namespace)}/pods/{_segment(name)}/status"
        return self.api_client.request(
            "PATCH", path, body=body, content_type=_patch_type(body), options=kw
        )

    def delete_namespaced_pod(self, name: str, namespace: str, body: Any = None, **kw: Any) -> Any:
        path = f"/api/v1/namespaces/{_segment(namespace)}/pods/{_segment(name)}"
        return self.api_client.request("DELETE", path, body=body, options=kw)

    def create_namespaced_event(self, namespace: str, body: Any, **kw: Any) -> Any:
        path = f"/api/v1/namespaces/{_segment(namespace)}/events"
        return self.api_client.request("POST", path, body=body, options=kw)

    def patch_namespaced_event(self, name: str, namespace: str, body: Any, **kw: Any) -> Any:
        path = f"/api/v1/namespaces/{_segment(namespace)}/events/{_segment(name)}"
        return self.api_client.request(
            "PATCH", path, body=body, content_type=_patch_type(body), options=kw
        )

    def list_namespace(self, **kw: Any) -> Any:
        return self.api_client.request("GET", "/api/v1/namespaces", options=kw)

    def read_namespace(self, name: str, **kw: Any) -> Any:
        return self.api_client.request("GET", f"/api/v1/namespaces/{_segment(name)}", options=kw)

    def read_node(self, name: str, **kw: Any) -> Any:
        return self.api_client.request("GET", f"/api/v1/nodes/{_segment(name)}", options=kw)

    def patch_node(self, name: str, body: Any, **kw: Any) -> Any:
        path = f"/api/v1/nodes/{_segment(name)}"
        return self.api_client.request(
            "PATCH", path, body=body, content_type=_patch_type(body), options=kw
        )


class AppsV1:
    """The apps/v1 calls the agent makes (its own DaemonSet: watched, and read at stop)."""

    def __init__(self, client: RestClient) -> None:
        self.api_client = client

    def list_namespaced_daemon_set(self, namespace: str, **kw: Any) -> Any:
        path = f"/apis/apps/v1/namespaces/{_segment(namespace)}/daemonsets"
        return self.api_client.request("GET", path, options=kw)

    def read_namespaced_daemon_set(self, name: str, namespace: str, **kw: Any) -> Any:
        path = f"/apis/apps/v1/namespaces/{_segment(namespace)}/daemonsets/{_segment(name)}"
        return self.api_client.request("GET", path, options=kw)
