"""Waiting on the API server's own events rather than polling it: list, then watch from the list's
version, judging the objects after every change until a condition holds or the deadline passes.

    ds = watch_until(apps.list_namespaced_daemon_set, lambda items: ..., "what", 60,
                     namespace="kube-system", field_selector="metadata.name=istio-cni")

A watch that ends early (the server's timeout, an expired version, a dropped connection) lists
again; the timeout names what was awaited, the last objects seen and the registered diagnostics.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from kubernetes import watch
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from testbed.wait import timed_out

T = TypeVar("T")
RETRY_PAUSE = 0.5
REQUEST_SLACK = 10
"""Seconds a watch request may outlive its own server-side timeout before the client gives up."""


def watch_until(
    list_call: Callable[..., Any],
    satisfied: Callable[[list[Any]], T | None],
    what: str,
    timeout: float,
    *,
    on_timeout: Callable[[], str] | None = None,
    **query: Any,
) -> T:
    """`satisfied(objects)` once it returns something truthy, judged on the listed objects and
    again after every watch event; `query` is the list call's arguments (namespace, selectors)."""
    deadline = time.monotonic() + timeout
    last: list[Any] = []

    def seen() -> str:
        names = [f"{o.metadata.namespace or ''}/{o.metadata.name}" for o in last]
        return f"last seen: {names}" + (f"\n{on_timeout()}" if on_timeout else "")

    while True:
        try:
            objects, version = _list(list_call, query)
            last = list(objects.values())
            result = satisfied(last)
            if result:
                return result
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise timed_out(what, timeout, seen)
            for current in _changes(list_call, query, objects, version, remaining):
                last = current
                result = satisfied(current)
                if result:
                    return result
                if time.monotonic() >= deadline:
                    break
        except (ApiException, HTTPError, OSError):
            pass  # listed again below, as a reflector does after a failed watch
        if time.monotonic() >= deadline:
            raise timed_out(what, timeout, seen)
        time.sleep(RETRY_PAUSE)


def _list(list_call: Callable[..., Any], query: dict[str, Any]) -> tuple[dict[str, Any], str]:
    listed = list_call(**query, _request_timeout=REQUEST_SLACK)
    objects = {_key(o): o for o in listed.items}
    return objects, listed.metadata.resource_version


def _changes(
    list_call: Callable[..., Any],
    query: dict[str, Any],
    objects: dict[str, Any],
    version: str,
    remaining: float,
) -> Any:
    """Yields the objects after each event of a watch from `version`, until it ends."""
    stream = watch.Watch()  # type: ignore[no-untyped-call]
    try:
        for event in stream.stream(  # type: ignore[no-untyped-call]
            list_call,
            **query,
            resource_version=version,
            timeout_seconds=max(1, int(remaining) + 1),
            _request_timeout=int(remaining) + REQUEST_SLACK,
        ):
            kind, obj = event["type"], event["object"]
            if kind == "ERROR":  # an expired version, say: list again
                return
            if kind == "DELETED":
                objects.pop(_key(obj), None)
            elif kind in ("ADDED", "MODIFIED"):
                objects[_key(obj)] = obj
            yield list(objects.values())
    finally:
        stream.stop()  # type: ignore[no-untyped-call]


def _key(obj: Any) -> str:
    return f"{obj.metadata.namespace or ''}/{obj.metadata.name}"
