"""A real Envoy as a pod's sidecar: started inside the pod's network namespace as the proxy's
user (UID and GID 1337; in TPROXY mode UID 0 and GID 1337 with NET_ADMIN only, as Istio's
injector runs it then), with testbed/envoy.py's configuration, and its access logs read back.

The binary is the cached test bed part (testbed/parts.py), whose path the proxy's user cannot
reach (root's home is 0700): it is hard-linked (or copied) into a 0755 work directory with the
configuration; only the log directory is the proxy's.

    with sidecar_envoy(netns_path, tproxy=False) as envoy: ...; envoy.log_lines("outbound.log")
"""

from __future__ import annotations

import ctypes
import http.client
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.netns import run_in_netns, setns
from testbed import envoy as config
from testbed.parts import envoy as envoy_part

START_TIMEOUT = 20.0
STOP_TIMEOUT = 10.0
PR_SET_PDEATHSIG = 1
PR_CAPBSET_DROP = 24
CAP_NET_ADMIN = 12
_libc = ctypes.CDLL(None, use_errno=True)


class EnvoyFailedError(RuntimeError):
    """Envoy did not become ready; the message carries the end of its own log."""


@dataclass
class SidecarEnvoy:
    netns: str
    workdir: Path
    proc: subprocess.Popen[bytes]

    @property
    def log_dir(self) -> Path:
        return self.workdir / "logs"

    def log_lines(self, name: str) -> list[dict[str, Any]]:
        """The access log `name` (config.OUTBOUND_LOG, config.INBOUND_LOG), one dict a line."""
        path = self.log_dir / name
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def wait_log_lines(self, name: str, count: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        """At least `count` lines of access log `name` (Envoy writes a TCP line when the
        connection closes, flushed every 100 ms), or what is there after `timeout`."""
        deadline = time.monotonic() + timeout
        lines = self.log_lines(name)
        while len(lines) < count and time.monotonic() < deadline:
            time.sleep(0.05)
            lines = self.log_lines(name)
        return lines

    def own_log(self) -> str:
        path = self.workdir / "envoy.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def admin(self, path: str) -> tuple[int, str]:
        """GET on the admin port (127.0.0.1 in the pod's netns)."""
        return run_in_netns(self.netns, lambda: _get("127.0.0.1", config.ADMIN_PORT, path))


def _get(host: str, port: int, path: str) -> tuple[int, str]:
    conn = http.client.HTTPConnection(host, port, timeout=2.0)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read().decode(errors="replace")
    finally:
        conn.close()


def _enter(netns: str, *, tproxy: bool) -> Callable[[], None]:
    """preexec_fn: into the netns, then the proxy's credentials; dies with the test process."""

    def enter() -> None:
        fd = os.open(netns, os.O_RDONLY)
        try:
            setns(fd)
        finally:
            os.close(fd)
        os.setgroups([])
        os.setgid(config.PROXY_GID)
        if tproxy:  # root keeps only NET_ADMIN (transparent sockets, original_src's mark)
            last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
            for cap in range(last + 1):
                if cap != CAP_NET_ADMIN:
                    _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
        else:
            os.setuid(config.PROXY_UID)
        # After the credentials change, which clears it.
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)

    return enter


def _workdir(*, tproxy: bool) -> Path:
    workdir = Path(tempfile.mkdtemp(prefix="sidecar-envoy-", dir="/tmp"))
    workdir.chmod(0o755)
    binary = envoy_part().require()
    try:
        os.link(binary, workdir / "envoy")
    except OSError:  # another file system
        shutil.copy2(binary, workdir / "envoy")
    logs = workdir / "logs"
    logs.mkdir()
    own_log = workdir / "envoy.log"  # Envoy's own log, written as the proxy's user too
    own_log.touch()
    for path, mode in ((logs, 0o775), (own_log, 0o664)):  # group: TPROXY's root has no DAC
        os.chown(path, config.PROXY_UID, config.PROXY_GID)
        path.chmod(mode)
    bootstrap = config.sidecar_config(log_dir=logs, tproxy=tproxy)
    (workdir / "envoy.json").write_text(json.dumps(bootstrap, indent=1))
    (workdir / "envoy.json").chmod(0o644)
    return workdir


@contextmanager
def sidecar_envoy(netns: str, *, tproxy: bool = False) -> Iterator[SidecarEnvoy]:
    """Envoy running in `netns` (a path), ready (admin /ready says LIVE); stopped and its work
    directory removed afterwards."""
    workdir = _workdir(tproxy=tproxy)
    argv = [
        str(workdir / "envoy"),
        "--config-path", str(workdir / "envoy.json"),
        "--disable-hot-restart",  # no shared memory: several Envoys on one machine
        "--concurrency", "1",
        "--file-flush-interval-msec", "100",
        "--log-level", "warning",
        "--log-path", str(workdir / "envoy.log"),
    ]  # fmt: skip
    proc: subprocess.Popen[bytes] | None = None
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=_enter(netns, tproxy=tproxy),
        )
        envoy = SidecarEnvoy(netns, workdir, proc)
        _wait_ready(envoy)
        yield envoy
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)


def _wait_ready(envoy: SidecarEnvoy) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    last = "no answer"
    while time.monotonic() < deadline:
        if envoy.proc.poll() is not None:
            raise EnvoyFailedError(
                f"envoy exited {envoy.proc.returncode} in {envoy.netns}: {envoy.own_log()}"
            )
        try:
            status, body = envoy.admin("/ready")
            if status == 200:
                return
            last = f"{status} {body.strip()}"
        except OSError as e:
            last = str(e)
        time.sleep(0.1)
    raise EnvoyFailedError(f"envoy in {envoy.netns} not ready: {last}; {envoy.own_log()}")
