"""A connection flood, run as its own process so its work never shares the caller's GIL.

    python -m testbed.flood [--tcp HOST:PORT --idle N --slowloris M]
                            [--stream PATH --stream-idle N] [--seqpacket PATH --seqpacket-idle N]
                            [--duration SECONDS]

Opens N idle connections to each target (held, never reopened), and M slowloris connections to
the TCP target: each sends a request line and then one header byte every TRICKLE seconds, never
ending its head, and is reopened when the server closes it. Prints one JSON line when every
connection was tried (`{"ready": ...}`), then, when stdin closes or `duration` ends, a last JSON
line with what happened (connections made, refused, closed by the server, how long slowloris
connections were held). Bounded by `duration` whatever the caller does. Only to addresses on
this machine and sockets of the caller's own test bed.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import resource
import selectors
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
TRICKLE = 0.5
CONNECT_TIMEOUT = 2.0


@dataclass
class Tally:
    made: int = 0
    failed: dict[str, int] = field(default_factory=dict)
    closed_by_server: int = 0

    def fail(self, e: OSError) -> None:
        name = errno.errorcode.get(e.errno or 0, type(e).__name__)
        self.failed[name] = self.failed.get(name, 0) + 1


def connect(
    family: int, kind: int, address: tuple[str, int] | str, tally: Tally
) -> socket.socket | None:
    """Connected within CONNECT_TIMEOUT, retrying a full backlog (a Unix socket's EAGAIN) as a
    persistent client does; None when it did not."""
    deadline = time.monotonic() + CONNECT_TIMEOUT
    sock = socket.socket(family, kind)
    sock.settimeout(CONNECT_TIMEOUT)
    while True:
        try:
            sock.connect(address)
            break
        except BlockingIOError as e:
            if time.monotonic() < deadline:
                time.sleep(0.001)
                continue
            tally.fail(e)
        except OSError as e:
            tally.fail(e)
        sock.close()
        return None
    sock.setblocking(False)
    tally.made += 1
    return sock


class Slowloris:
    """M connections that each trickle a never-ending head; reopened when closed."""

    def __init__(self, address: tuple[str, int], count: int, sel: selectors.BaseSelector) -> None:
        self.address = address
        self.count = count
        self.sel = sel
        self.tally = Tally()
        self.opened: dict[socket.socket, float] = {}
        self.held: list[float] = []
        """Seconds each connection lived until the server closed it."""

    def fill(self) -> None:
        while len(self.opened) < self.count:
            sock = connect(socket.AF_INET, socket.SOCK_STREAM, self.address, self.tally)
            if sock is None:
                return
            with contextlib.suppress(OSError):
                sock.send(b"GET /healthz HTTP/1.1\r\nHost: flood\r\n")
            self.opened[sock] = time.monotonic()
            self.sel.register(sock, selectors.EVENT_READ, self)

    def trickle(self) -> None:
        for sock in list(self.opened):
            try:
                sock.send(b"X")
            except BlockingIOError:
                pass
            except OSError:
                self.ended(sock)

    def ended(self, sock: socket.socket) -> None:
        began = self.opened.pop(sock, None)
        if began is None:
            return
        self.held.append(time.monotonic() - began)
        self.tally.closed_by_server += 1
        self.sel.unregister(sock)
        sock.close()

    def close(self) -> None:
        for sock in list(self.opened):
            self.sel.unregister(sock)
            sock.close()
        self.opened.clear()


def run(opts: argparse.Namespace) -> dict[str, object]:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    deadline = time.monotonic() + opts.duration
    sel = selectors.DefaultSelector()
    idle: list[tuple[str, Tally, list[socket.socket]]] = []
    targets = []
    if opts.tcp:
        host, _, port = opts.tcp.rpartition(":")
        targets.append(("tcp", socket.AF_INET, socket.SOCK_STREAM, (host, int(port)), opts.idle))
    if opts.stream:
        stream = ("stream", socket.AF_UNIX, socket.SOCK_STREAM, opts.stream, opts.stream_idle)
        targets.append(stream)
    if opts.seqpacket:
        kind = socket.SOCK_SEQPACKET
        targets.append(("seqpacket", socket.AF_UNIX, kind, opts.seqpacket, opts.seqpacket_idle))
    began = time.monotonic()
    for name, family, kind, address, count in targets:
        tally, socks = Tally(), []
        for _ in range(count):
            if time.monotonic() >= deadline:
                break
            sock = connect(family, kind, address, tally)
            if sock is not None:
                socks.append(sock)
        idle.append((name, tally, socks))
    loris = None
    if opts.tcp and opts.slowloris:
        host, _, port = opts.tcp.rpartition(":")
        loris = Slowloris((host, int(port)), opts.slowloris, sel)
        loris.fill()
    print(
        json.dumps({"ready": {n: t.made for n, t, _ in idle}, "seconds": time.monotonic() - began}),
        flush=True,
    )
    stdin = sys.stdin.buffer
    sel.register(stdin, selectors.EVENT_READ, None)
    next_trickle = time.monotonic()
    done = False
    while not done and time.monotonic() < deadline:
        for key, _ in sel.select(timeout=0.1):
            if key.data is None:
                done = not os.read(stdin.fileno(), 4096)
            elif loris is not None:
                conn = key.fileobj
                assert isinstance(conn, socket.socket)
                try:
                    data = conn.recv(4096)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:
                    loris.ended(conn)
        if loris is not None and time.monotonic() >= next_trickle:
            next_trickle = time.monotonic() + TRICKLE
            loris.trickle()
            loris.fill()
    report: dict[str, object] = {}
    for name, tally, socks in idle:
        tally.closed_by_server = sum(1 for s in socks if _closed(s))
        report[name] = vars(tally)
        for sock in socks:
            sock.close()
    if loris is not None:
        report["slowloris"] = {
            **vars(loris.tally),
            "held_max": max(loris.held, default=0.0),
            "held_count": len(loris.held),
        }
        loris.close()
    return report


def _closed(sock: socket.socket) -> bool:
    """The server closed it (EOF or reset); data it sent is read and dropped."""
    try:
        while True:
            if not sock.recv(65536):
                return True
    except BlockingIOError:
        return False
    except OSError:
        return True


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed.flood")
    parser.add_argument("--tcp", help="HOST:PORT")
    parser.add_argument("--idle", type=int, default=0)
    parser.add_argument("--slowloris", type=int, default=0)
    parser.add_argument("--stream", help="a Unix stream socket's path")
    parser.add_argument("--stream-idle", type=int, default=0)
    parser.add_argument("--seqpacket", help="a Unix seqpacket socket's path")
    parser.add_argument("--seqpacket-idle", type=int, default=0)
    parser.add_argument("--duration", type=float, default=60.0)
    print(json.dumps(run(parser.parse_args())), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())


class Flood:
    """`python -m testbed.flood ARGS` (or another `module` speaking the same way, such as
    testbed.attacks) as a child: started by __enter__, which returns once every connection was
    tried; stop() ends it and returns its report."""

    def __init__(
        self,
        args: list[str],
        *,
        duration: float = 120.0,
        module: str = "testbed.flood",
        program: Path | None = None,
        netns: str | None = None,
        via: list[str] | None = None,
        python: str = sys.executable,
    ) -> None:
        """`program`: a binary speaking the same way (testbed/attacks_go), run instead;
        `netns`: the path of a network namespace it runs in (a node's, say) instead of ours;
        `via`: a command it is run through instead (`ctr tasks exec ... CONTAINER`: in a pod's
        container, with the repository mounted as its working directory), with `python`."""
        self.args = [*args, "--duration", str(duration)]
        self.module = module if program is None else program.name
        self._argv = [python, "-m", module] if program is None else [str(program)]
        if netns is not None:
            self._argv = ["nsenter", f"--net={netns}", "--", *self._argv]
        if via is not None:
            self._argv = [*via, *self._argv]
        self.ready: dict[str, object] = {}
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Flood:
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        self._proc = subprocess.Popen(
            [*self._argv, *self.args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            cwd=REPO_ROOT,
        )
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line:
            self._proc.wait(30)
            raise RuntimeError(f"{self.module} exited {self._proc.returncode} before it was ready")
        self.ready = json.loads(line)
        return self

    def stop(self) -> dict[str, Any]:
        proc, self._proc = self._proc, None
        if proc is None:
            return {}
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.close()
        line = proc.stdout.readline()
        proc.stdout.close()
        proc.wait(30)
        report: dict[str, Any] = json.loads(line) if line else {}
        return report

    def __exit__(self, *exc: object) -> None:
        proc = self._proc
        if proc is not None:
            proc.kill()
            proc.wait(30)
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    pipe.close()
            self._proc = None
