"""A long-running child process of the test bed, its output in a log file, always reaped."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


class PartFailedError(RuntimeError):
    """A part of the test bed did not start or stopped; the message names it and ends with the
    tail of its log."""

    def __init__(self, message: str, *, port_clash: bool = False) -> None:
        super().__init__(message)
        self.port_clash = port_clash
        """Its log says a port it was given was taken meanwhile: worth a retry."""


class Daemon:
    """One named process (etcd, kube-apiserver, ...) in its own process group. `env` replaces
    the environment when given (else inherited); `cwd` is where it runs (else inherited)."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self._proc = _spawn(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own group, so stop() reaches any children too
                preexec_fn=_die_with_parent,
                env=self.env,
                cwd=self.cwd,
            )

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError as e:
            return f"(no log: {e})"
        return "\n".join(text.splitlines()[-lines:])

    def failure(self, what: str) -> PartFailedError:
        """An error naming this part, what went wrong, and the end of its log."""
        status = ""
        if self._proc is not None and self._proc.poll() is not None:
            status = f" (exited with {self._proc.returncode})"
        tail = self.tail()
        return PartFailedError(
            f"test bed part '{self.name}' {what}{status}; log {self.log_path}, last lines:\n{tail}",
            port_clash="address already in use" in tail,
        )

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM, then SIGKILL after `timeout`; idempotent."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            _signal_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                _signal_group(proc.pid, signal.SIGKILL)
                proc.wait()
        else:
            _signal_group(proc.pid, signal.SIGKILL)  # leftovers of an exited leader


_SPAWNER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="daemon-spawner")
"""The thread that forks daemons started off the main thread: PR_SET_PDEATHSIG fires when the
forking *thread* exits, so a daemon forked by a short-lived worker (a fault's restart in
bench/soak) would be killed the moment that worker returned. This one lives as long as the
process."""


def _spawn(argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    def popen() -> subprocess.Popen[bytes]:
        return subprocess.Popen(argv, **kwargs)

    if threading.current_thread() is threading.main_thread():
        return popen()
    return _SPAWNER.submit(popen).result()


def _die_with_parent() -> None:
    """In the child before exec: get SIGKILL when the test process dies, even by SIGKILL, so
    no etcd or kube-apiserver outlives an aborted run."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)


def pid_alive(pid: int) -> bool:
    """The process exists (possibly as another user's)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
