"""The checks of the agent's own parts (the node's parts are netns_dir.py and scratch.py):

install     the plugin binary and our conflist entry in place (the install watcher's word,
            with the installer's list of what is missing)
pod-socket  the plugin's socket answers an HTTP request, as the plugin's first one: the file
            at the node path is ours and the server behind it serves
api         the pod cache has listed this node's pods, or the API server answers a list of
            them (an ADD then looks its pod up by a GET)
ambient     (ambient mode) the ZDS server listens for ztunnel
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

from agent.kube import api
from plugin import wire

SOCKET_TIMEOUT_SECONDS = 2.0


def install_check(
    ready: Callable[[], bool], problems: Callable[[], list[str]]
) -> Callable[[], str | None]:
    def run() -> str | None:
        if ready():
            return None
        found = problems()
        return "; ".join(found) if found else "the plugin and its config entry are being installed"

    return run


def socket_check(path: str) -> Callable[[], str | None]:
    def run() -> str | None:
        try:
            status = _status_line(path)
        except OSError as e:
            return f"the plugin's socket {path} does not answer: {e.strerror or e}"
        if not status.startswith("HTTP/1."):
            return f"the plugin's socket {path} answered {status[:60]!r}, not HTTP"
        return None

    return run


def _status_line(path: str) -> str:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(SOCKET_TIMEOUT_SECONDS)
        sock.connect(path)
        request = f"GET {wire.PATH_STATUS} HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n"
        sock.sendall(request.encode())
        data = b""
        while b"\r\n" not in data and len(data) < 256:
            chunk = sock.recv(256)
            if not chunk:
                break
            data += chunk
    return data.split(b"\r\n", 1)[0].decode("latin-1")


def api_check(
    synced: Callable[[], bool],
    core: Any,
    node_name: str,
    timeouts: api.Timeouts = api.DEFAULT_TIMEOUTS,
) -> Callable[[], str | None]:
    """Passes while the cache is synced; before that, while a list of the node's pods works."""

    def run() -> str | None:
        if synced():
            return None
        try:
            api.call(
                core.list_pod_for_all_namespaces,
                field_selector=f"spec.nodeName={node_name}",
                limit=1,
                timeout=timeouts.readiness(),
                raw=False,
            )
        except Exception as e:  # any failure: the API cannot serve an ADD's lookup now
            return (
                "the pod cache has not listed this node's pods and the API server does not "
                f"answer a list of them: {_short(api.original(e))}"
            )
        return None

    return run


def ambient_check(ready: Callable[[], bool], socket_path: str) -> Callable[[], str | None]:
    def run() -> str | None:
        if ready():
            return None
        return f"ambient: the ZDS server for ztunnel ({socket_path}) is not listening yet"

    return run


def _short(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return text[:200] + ("..." if len(text) > 200 else "")
