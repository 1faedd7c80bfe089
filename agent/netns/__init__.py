"""Run code inside another network namespace without touching the rest of the process.

`setns(2)` changes the namespace of the calling thread only. `run_in_netns` starts a fresh
thread, switches that thread into the target namespace, runs the function and lets the thread
end, so no thread that ever entered a pod's namespace is reused for anything else. Python 3.11
has no os.setns, so the call goes through libc with ctypes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import subprocess
import threading
from collections.abc import Callable
from typing import TypeVar

from agent.errors import RedirectError
from agent.netns.userns import enter_as_root, foreign_owner

CLONE_NEWNET = 0x40000000
T = TypeVar("T")

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def setns(fd: int, nstype: int = CLONE_NEWNET) -> None:
    """Move the calling thread into the namespace open at `fd`."""
    if _libc.setns(fd, nstype) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def run_in_netns(path: str, fn: Callable[[], T]) -> T:
    """Call `fn()` in a new thread that lives inside the network namespace at `path`.

    Raises RedirectError when the namespace cannot be entered; exceptions of `fn` pass through.
    """
    result: list[T] = []
    error: list[BaseException] = []

    def body() -> None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            error.append(RedirectError(f"open network namespace {path}: {e.strerror}"))
            return
        try:
            setns(fd)
        except OSError as e:
            error.append(RedirectError(f"enter network namespace {path}: {e.strerror}"))
            return
        finally:
            os.close(fd)
        try:
            result.append(fn())
        except BaseException as e:  # re-raised in the caller's thread
            error.append(e)

    thread = threading.Thread(target=body, name=f"netns:{os.path.basename(path)}", daemon=True)
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]


def setns_preexec(path: str) -> Callable[[], None]:
    """A subprocess `preexec_fn` that moves the child into the namespace at `path`."""

    def enter() -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            setns(fd)
        finally:
            os.close(fd)

    return enter


COMMAND_TIMEOUT_SECONDS = 60.0
"""The longest a program run in a pod's namespace may take (iptables-restore, nft, ip): what
the liveness bounds of the workers that run them are made of (agent.liveness)."""


def run_command(
    path: str,
    argv: list[str],
    stdin: str = "",
    *,
    timeout: float = COMMAND_TIMEOUT_SECONDS,
    as_owner: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run a program inside the namespace at `path`: forked from a thread that entered it. With
    `as_owner` (iptables-restore: owner matches), in a namespace owned by another user namespace
    (a user-namespaced pod's) the program runs as that namespace's root (agent.netns.userns says
    why), with the namespace itself as iptables-legacy's lock file (its root cannot open the
    node's /run/xtables.lock; the tables it guards are the namespace's own). Readers stay the
    agent's: that root may not read the legacy tables' /proc/net files."""
    owner = foreign_owner(path) if as_owner else None
    if owner is None:

        def call() -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                argv, input=stdin, capture_output=True, text=True, timeout=timeout
            )

        return run_in_netns(path, call)

    def call_as_owner() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            argv, input=stdin, capture_output=True, text=True, timeout=timeout,
            pass_fds=(owner,), preexec_fn=enter_as_root(owner),
            env={**os.environ, "XTABLES_LOCKFILE": path},
        )  # fmt: skip

    try:
        return run_in_netns(path, call_as_owner)
    finally:
        os.close(owner)
