"""rules: the rules backend programs a pod's rules, and finds them in place, in a scratch network
namespace of the agent's own: what every sidecar pod's ADD does, minus the pod.

The namespace is made once, at start (unshare(2) on a thread of its own, which then ends), and
held by a file descriptor only: no process lives in it, nothing is mounted for it, and closing
the descriptor (stop) frees it, so nothing is left behind even when the agent is killed. Each run
applies the rules of a pod with every Istio default (idempotent: our rules replace our rules) and
checks them, a few milliseconds of iptables-restore or nft.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
from collections.abc import Mapping
from typing import Any, Protocol

from agent.netns import CLONE_NEWNET

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)

SCRATCH_POD: Mapping[str, Any] = {
    "metadata": {"name": "readiness-check", "namespace": "istio-cni", "uid": "", "annotations": {}},
    "spec": {"containers": [{"name": "app"}, {"name": "istio-proxy"}]},
}
"""A sidecar pod as Istio's injector leaves it, with no annotation changing the rules."""


class Rules(Protocol):
    """The pod server's redirector (agent.rules.sidecar.redirector.RulesRedirector)."""

    def apply(self, netns: str, pod: Mapping[str, Any]) -> str: ...

    def present(self, netns: str, pod: Mapping[str, Any]) -> bool: ...


class ScratchNetns:
    """A network namespace held by a descriptor; `path` opens it (for setns and the backends)."""

    def __init__(self) -> None:
        self._fd: int | None = None

    @property
    def path(self) -> str:
        if self._fd is None:
            raise OSError("the scratch network namespace is not open")
        return f"/proc/{os.getpid()}/fd/{self._fd}"

    def open(self) -> None:
        if self._fd is None:
            self._fd = _new_netns()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _new_netns() -> int:
    """A descriptor of a new network namespace, made on a thread that ends after making it, so
    no thread of the agent stays in it."""
    result: list[int] = []
    error: list[OSError] = []

    def body() -> None:
        if _libc.unshare(CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            error.append(OSError(err, f"unshare(CLONE_NEWNET): {os.strerror(err)}"))
            return
        result.append(os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC))

    thread = threading.Thread(target=body, name="scratch-netns", daemon=True)
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]


class RulesCheck:
    """`check()` for the readiness service; `start()` / `stop()` hold the scratch namespace."""

    def __init__(self, rules: Rules, *, backend: str) -> None:
        self._rules = rules
        self._backend = backend
        self.scratch = ScratchNetns()
        self._error = ""

    def start(self) -> None:
        try:
            self.scratch.open()
        except OSError as e:  # reported by every check until it works
            self._error = str(e)

    def stop(self) -> None:
        self.scratch.close()

    def __call__(self) -> str | None:
        if self._error:
            return (
                f"cannot make a scratch network namespace to check the rules backend: {self._error}"
            )
        try:
            used = self._rules.apply(self.scratch.path, SCRATCH_POD)
            if not self._rules.present(self.scratch.path, SCRATCH_POD):
                return f"rules backend {used}: the rules applied in a scratch netns are not there"
        except Exception as e:
            return f"rules backend {self._backend} fails in a scratch network namespace: {e}"
        return None
