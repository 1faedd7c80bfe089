"""HTTP/1.1 to the agent over its Unix socket: one request per connection, hard time limits.

Connect timeout 1 s, a total deadline per request (the entry's `agent_timeout_seconds`, default
10 s), and at most 1 MiB of reply body. A socket that is missing, refuses, resets or times out
raises AgentUnavailable (CNI code 11, "try again later"); an answer with an error status becomes
a CniError carrying the agent's code and message.
"""

from __future__ import annotations

# The C module, not `socket`: socket.py builds IntEnums of every constant at import, ~3 ms of
# start-up per pod for features a single Unix-socket request does not use.
import _socket
import time

from plugin import framing, wire
from plugin.errors import CniError
from plugin.wire import INTERNAL, TRY_AGAIN_LATER

TYPE_CHECKING = False  # not typing's: importing typing costs ~10 ms of start-up
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import TypeVar

    from plugin.framing import HttpResponse
    from plugin.wire import CniRequest, GcRequest, LogRequest, Reply, StatusReply

    T = TypeVar("T")

CONNECT_TIMEOUT = 1.0
LOG_TIMEOUT = 0.5
"""A log line is best effort: never hold a pod's sandbox for it longer than this."""


class AgentUnavailable(CniError):
    """No answer from the agent (socket missing, refused, reset, timed out)."""

    def __init__(self, msg: str, details: str = "") -> None:
        super().__init__(TRY_AGAIN_LATER, msg, details)


class AgentClient:
    """Talks to the agent listening on `wire.socket_path(run_dir)`."""

    def __init__(self, run_dir: str, *, timeout: float, limit: int = wire.MAX_BODY) -> None:
        self.path = wire.socket_path(run_dir)
        self.timeout = timeout
        self.limit = limit

    def cni(self, command: str, body: CniRequest) -> Reply:
        """ADD, CHECK or DEL; returns the agent's 200 reply or raises CniError."""
        response = self._call("POST", wire.COMMAND_PATHS[command], wire.encode(body))
        return self._parse(response, wire.parse_reply)

    def gc(self, body: GcRequest) -> Reply:
        return self._parse(self._call("POST", wire.PATH_GC, wire.encode(body)), wire.parse_reply)

    def status(self) -> StatusReply:
        """GET /v1/status: 200 and 503 both carry {"ready", "reason"}."""
        response = self._call("GET", wire.PATH_STATUS, None)
        if response.status in (200, 503):
            return self._parse(response, wire.parse_status_reply, ok=(200, 503))
        raise self._error(response)

    def log(self, body: LogRequest) -> bool:
        """Best effort: False when the line did not reach the agent."""
        try:
            response = self._call(
                "POST", wire.PATH_LOG, wire.encode(body), timeout=min(self.timeout, LOG_TIMEOUT)
            )
        except CniError:
            return False
        return 200 <= response.status < 300

    def _call(
        self, method: str, path: str, body: bytes | None, *, timeout: float | None = None
    ) -> HttpResponse:
        total = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + total
        where = f"{method} {path} on {self.path}"
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        try:
            _connect(sock, self.path, min(CONNECT_TIMEOUT, total))

            def recv(n: int) -> bytes:
                sock.settimeout(max(deadline - time.monotonic(), 0.001))
                return sock.recv(n)

            try:
                sock.settimeout(max(deadline - time.monotonic(), 0.001))
                sock.sendall(framing.http_request(method, path, body))
                return framing.read_http_response(recv, limit=self.limit)
            except TimeoutError as e:
                raise AgentUnavailable(
                    f"istio-cni agent did not answer within {total:g} s", where
                ) from e
            except OSError as e:
                raise AgentUnavailable(
                    "istio-cni agent connection failed", f"{where}: {_reason(e)}"
                ) from e
            except wire.WireError as e:
                raise CniError(
                    INTERNAL, "istio-cni agent sent a malformed HTTP response", f"{where}: {e}"
                ) from e
        finally:
            sock.close()

    def _parse(
        self, response: HttpResponse, parse: Callable[[bytes], T], ok: tuple[int, ...] = (200,)
    ) -> T:
        if response.status not in ok:
            raise self._error(response)
        if response.truncated:
            raise CniError(
                INTERNAL,
                f"istio-cni agent reply exceeds {self.limit} bytes",
                f"HTTP {response.status}, cut at {self.limit} bytes",
            )
        try:
            return parse(response.body)
        except wire.WireError as e:
            raise CniError(INTERNAL, "istio-cni agent sent an invalid reply", str(e)) from e

    def _error(self, response: HttpResponse) -> CniError:
        reply = wire.parse_error_reply(response.body, response.status)
        return CniError(reply["code"], reply["msg"], reply["details"])


def _connect(sock: _socket.socket, path: str, timeout: float) -> None:
    """Connect within `timeout`; a full listen backlog (EAGAIN on a Unix socket) is retried."""
    deadline = time.monotonic() + timeout
    while True:
        sock.settimeout(max(deadline - time.monotonic(), 0.001))
        try:
            sock.connect(path)
            return
        except BlockingIOError as e:
            if time.monotonic() + 0.005 >= deadline:
                raise AgentUnavailable(
                    "istio-cni agent is not reachable",
                    f"connect {path}: backlog full for {timeout:g} s",
                ) from e
            time.sleep(0.005)
        except OSError as e:
            raise AgentUnavailable(
                "istio-cni agent is not reachable", f"connect {path}: {_reason(e)}"
            ) from e


def _reason(e: OSError) -> str:
    return e.strerror or str(e) or type(e).__name__
