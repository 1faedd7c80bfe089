"""The one boundary to the Kubernetes API: how every call is made, answered and failed.

`call` makes a call with the timeout of its kind (`Timeouts`, from the settings' `kubeApi`), as a
raw response unless told otherwise; `get_json` decodes the answer too. A failure leaves here as
one of the agent's errors (agent.errors), by what the caller can do about it:

    KubeApiError          the API server did not give the answer asked for (retry later)
     ├── ApiNotFound      404: the object does not exist
     ├── ApiForbidden     401/403: the agent's credentials do not allow it (give up until the
     │                    operator fixes them)
     ├── ApiConflict      409/422: the object changed under the caller (read it again)
     └── ApiGone          410: a watch's version expired (list again)

An error names the answer (`API server answered 500 Internal Server Error`), or for a call that
got none (connection refused, timeout, an answer that is not JSON) the transport's own message;
`cause` is the client's exception.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import urllib3

from agent.config import KubeApiSettings
from agent.errors import ApiConflict, ApiForbidden, ApiGone, ApiNotFound, KubeApiError
from agent.kube.rest import ApiError
from agent.kube.throttle import Throttled

Timeout = float | tuple[float, float]
"""Seconds for the whole call, or (connect, read)."""

CONNECT_SECONDS = 2.0
"""Connecting, for the calls a CNI ADD waits on (pod and namespace lookups, ambient's patch)."""
SLOW_CONNECT_SECONDS = 5.0
"""Connecting, for the calls nothing waits on (the caches' lists and watches, the node)."""
WATCH_SLACK_SECONDS = 30.0
"""A watch's read timeout beyond its server-side timeout: the server ends it first."""
WATCH_IDLE_SECONDS = 130.0
"""The longest a watch may stay silent (its read timeout when shorter than the server-side
timeout + slack): the API server sends a bookmark about every 60 s on a watch that asked for
them, so two missed bookmarks and 10 s of slack mean the server or the path to it is gone,
noticed in about 2 minutes, not after the watch's 4-8 minutes. A server that sent no bookmark
costs a watch resumed from its last version every ~2 minutes, which is cheap: a quiet watch is
how a quiet cluster looks to a server that sends none (kube-apiserver sends them only when its
watch cache moves on), so that resumption is routine, neither a failure nor backed off."""


@dataclass(frozen=True)
class Timeouts:
    """The timeout of each kind of call: the settings' read timeouts (`kubeApi.*`), with the
    time to connect."""

    settings: KubeApiSettings = field(default_factory=KubeApiSettings)
    watch_idle_seconds: float = WATCH_IDLE_SECONDS

    def lookup(self, within: float | None = None) -> Timeout:
        """`within`: what is left of a lookup's time (its retries share it), if less."""
        read = float(self.settings.lookupTimeoutSeconds)
        if within is not None and within < read:
            return (CONNECT_SECONDS, max(0.001, within))
        return (CONNECT_SECONDS, self.settings.lookupTimeoutSeconds)

    def update(self) -> Timeout:
        return (CONNECT_SECONDS, self.settings.updateTimeoutSeconds)

    def list(self) -> Timeout:
        return (SLOW_CONNECT_SECONDS, self.settings.listTimeoutSeconds)

    def watch(self, server_seconds: int) -> Timeout:
        read = min(server_seconds + WATCH_SLACK_SECONDS, self.watch_idle_seconds)
        return (SLOW_CONNECT_SECONDS, read)

    def node(self) -> Timeout:
        return (SLOW_CONNECT_SECONDS, self.settings.nodeTimeoutSeconds)

    def stop(self) -> Timeout:
        return float(self.settings.stopTimeoutSeconds)

    def readiness(self) -> Timeout:
        return float(self.settings.readinessTimeoutSeconds)


DEFAULT_TIMEOUTS = Timeouts()


_BY_STATUS: dict[int, type[KubeApiError]] = {
    404: ApiNotFound,
    401: ApiForbidden,
    403: ApiForbidden,
    409: ApiConflict,
    422: ApiConflict,
    410: ApiGone,
}


def call(fn: Callable[..., Any], *args: Any, timeout: Timeout, raw: bool = True, **kw: Any) -> Any:
    """`fn(*args, **kw)` with `timeout`; the raw response (`raw`), else what the client makes of
    it. Raises KubeApiError (a subclass by status)."""
    if raw:
        kw["_preload_content"] = False
    try:
        return fn(*args, _request_timeout=timeout, **kw)
    except (urllib3.exceptions.HTTPError, OSError, Throttled) as e:
        raise KubeApiError(e) from e
    except Exception as e:
        if not _is_answer(e):
            raise
        status = getattr(e, "status", None)
        kind = _BY_STATUS.get(status or 0, KubeApiError)
        raise kind(e, status, getattr(e, "reason", None), answered=True) from e


def is_read_timeout(error: BaseException) -> bool:
    """The read timeout of a streaming response (a watch): nothing came for that long."""
    return isinstance(error, urllib3.exceptions.ReadTimeoutError)


def _is_answer(error: Exception) -> bool:
    """The API server's answer as an error: ours (agent.kube.rest), or the kubernetes client's
    ApiException (tests hand its CoreV1Api to the caches; not imported here: its package alone
    costs what agent.kube.rest saves)."""
    if isinstance(error, ApiError):
        return True
    kind = type(error)
    return kind.__name__ == "ApiException" and kind.__module__.startswith("kubernetes.")


def get_json(
    fn: Callable[..., Any],
    *args: Any,
    timeout: Timeout,
    loads: Callable[[bytes], Any] = json.loads,
    **kw: Any,
) -> dict[str, Any]:
    """`call`, and the answer's JSON object (read by `loads`: what the caller builds of it)."""
    return decode(call(fn, *args, timeout=timeout, **kw), loads)


def decode(response: Any, loads: Callable[[bytes], Any] = json.loads) -> dict[str, Any]:
    """The JSON object of a raw response; KubeApiError when it is not one."""
    try:
        data: dict[str, Any] = loads(response.data)
    except ValueError as e:
        raise KubeApiError(e) from e
    return data


def original(error: BaseException) -> BaseException:
    """The client's own exception behind a KubeApiError (for messages as the client words them)."""
    return error.cause if isinstance(error, KubeApiError) else error
