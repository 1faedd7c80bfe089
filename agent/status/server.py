"""The status socket: a read-only query of the running agent, for `istio-cni-agent status`.

`<cniAgentRunDir>/status.sock`, mode 0600 (agent.unix_socket) and SO_PEERCRED as the plugin's
socket: only root in the agent's container (`kubectl exec ... -- istio-cni-agent status`) or on
the node reaches it. Served on a loop of its own, one connection at a time answered (a rule
comparison runs `-save` programs in a pod's namespace), at most 8 connections, no request body:
nothing here can delay a pod's start or change anything.

    GET /v1/pods                  the node's pods with their state
    GET /v1/pods/NAMESPACE/NAME   one pod, and its rules against what the agent would program
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket

from agent import unix_socket
from agent.errors import ServerError, SocketPathError
from agent.serving.http import Request, Response
from agent.serving.limits import Limits
from agent.serving.loop import Server
from agent.serving.peer import untrusted_peer
from agent.status.report import StatusReport

log = logging.getLogger(__name__)

SOCKET_NAME = "status.sock"
LIMITS = Limits(max_connections=8, request_timeout=5.0, idle_timeout=10.0, write_timeout=10.0)
PODS = "/v1/pods"
_NAME = re.compile(r"[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?")
JSON = "application/json"


def socket_path(run_dir: str) -> str:
    return os.path.join(run_dir, SOCKET_NAME)


def _reply(status: int, body: object, *, close: bool = False) -> Response:
    return Response(status, json.dumps(body, ensure_ascii=True).encode(), JSON, close=close)


class _Routes:
    def __init__(self, report: StatusReport) -> None:
        self.report = report

    def handle(self, request: Request) -> Response:
        if request.method != "GET":
            return _reply(405, {"error": "use GET"}, close=True)
        path = request.path
        if path == PODS:
            return _reply(200, self.report.listing())
        parts = path.removeprefix(PODS + "/").split("/")
        named = len(parts) == 2 and all(_NAME.fullmatch(p) for p in parts)
        if path.startswith(PODS + "/") and named:
            return _reply(*self.report.detail(parts[0], parts[1]))
        return _reply(404, {"error": "no such endpoint: GET /v1/pods or /v1/pods/NAMESPACE/NAME"})

    def refuse(self, status: int, message: str) -> Response:
        return _reply(status, {"error": message}, close=True)


class StatusServer:
    """Service: serves `report` on `path`."""

    def __init__(self, path: str, report: StatusReport) -> None:
        self.path = path
        self._report = report
        self._server: Server | None = None
        self._inode: int | None = None

    def start(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._inode = unix_socket.bind_private(
                sock, self.path, what="status socket", backlog=16
            )
        except SocketPathError as e:
            sock.close()
            raise ServerError(str(e)) from e
        except BaseException:
            sock.close()
            raise
        self._server = Server(
            sock, _Routes(self._report), LIMITS, name="status", check_peer=untrusted_peer
        )
        self._server.start()
        log.info("status socket listening", extra={"fields": {"socket": self.path}})

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.stop()
            unix_socket.remove_if_ours(self.path, self._inode)
