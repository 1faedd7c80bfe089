"""The peak RSS of every run of one executable on the node, whoever starts it (here: containerd
running a CNI plugin for each pod sandbox), without wrapping or replacing the file (the node
agents watch their plugin and would put it back).

The kernel's process connector (netlink, root) reports each exec; a process whose
/proc/PID/exe is the executable is then read every half millisecond until it is gone, keeping
its last VmHWM (the kernel's own high-water mark of its resident set, so a sample between peaks
loses nothing; only growth in the last half millisecond before exit can be missed). Children it
starts (Istio's plugin runs iptables-restore) are not counted: the figure is the plugin's own.

    with ExecPeaks("/opt/cni/bin/istio-cni") as peaks:
        ...                     # pods started
    peaks.kib                   # one peak per run, KiB
    peaks.by_command            # the same by the run's CNI_COMMAND (ADD, DEL, CHECK, ...)
"""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
from types import TracebackType

NETLINK_CONNECTOR = 11
CN_IDX_PROC = 1
CN_VAL_PROC = 1
PROC_CN_MCAST_LISTEN = 1
PROC_CN_MCAST_IGNORE = 2
PROC_EVENT_EXEC = 0x00000002
NLMSG_DONE = 3
NLMSG_HDR = struct.Struct("=IHHII")
CN_MSG = struct.Struct("=IIIIHH")
EVENT_HEAD = struct.Struct("=IIQ")
EXEC_DATA = struct.Struct("=II")
POLL_SECONDS = 0.0005


def _control(op: int) -> bytes:
    payload = struct.pack("=I", op)
    cn = CN_MSG.pack(CN_IDX_PROC, CN_VAL_PROC, 0, 0, len(payload), 0) + payload
    return NLMSG_HDR.pack(NLMSG_HDR.size + len(cn), NLMSG_DONE, 0, 0, os.getpid()) + cn


def _exec_pids(datagram: bytes) -> list[int]:
    """The pids of the exec events in one netlink datagram."""
    pids = []
    offset = 0
    while offset + NLMSG_HDR.size <= len(datagram):
        length = NLMSG_HDR.unpack_from(datagram, offset)[0]
        if length < NLMSG_HDR.size:
            break
        event = offset + NLMSG_HDR.size + CN_MSG.size
        if event + EVENT_HEAD.size + EXEC_DATA.size <= offset + length:
            what = EVENT_HEAD.unpack_from(datagram, event)[0]
            if what == PROC_EVENT_EXEC:
                pids.append(EXEC_DATA.unpack_from(datagram, event + EVENT_HEAD.size)[1])
        offset += (length + 3) & ~3
    return pids


def high_water_kib(pid: int) -> int | None:
    """VmHWM of a live process; None once it is gone (or a zombie: its memory is released)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def cni_command(pid: int) -> str:
    """The run's CNI_COMMAND ("?" when it is gone or has none)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            for var in f.read().split(b"\0"):
                if var.startswith(b"CNI_COMMAND="):
                    return var.split(b"=", 1)[1].decode(errors="replace")
    except OSError:
        pass
    return "?"


class ExecPeaks:
    def __init__(self, executable: str) -> None:
        self.executable = os.path.realpath(executable)
        self.kib: list[int] = []
        self.by_command: dict[str, list[int]] = {}
        self.missed = 0
        """Runs seen exec but gone before their memory could be read once."""
        self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_CONNECTOR)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._watchers: list[threading.Thread] = []
        self._listener = threading.Thread(target=self._listen, name="exec-peaks", daemon=True)

    def __enter__(self) -> ExecPeaks:
        self._sock.bind((os.getpid(), CN_IDX_PROC))
        self._sock.settimeout(0.2)
        self._sock.send(_control(PROC_CN_MCAST_LISTEN))
        self._listener.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._listener.join()
        for watcher in list(self._watchers):
            watcher.join()
        try:
            self._sock.send(_control(PROC_CN_MCAST_IGNORE))
        finally:
            self._sock.close()

    def _listen(self) -> None:
        while not self._stop.is_set():
            try:
                datagram = self._sock.recv(65536)
            except TimeoutError:
                continue
            for pid in _exec_pids(datagram):
                try:
                    exe = os.readlink(f"/proc/{pid}/exe")
                except OSError:
                    continue
                if exe == self.executable:
                    command = cni_command(pid)
                    watcher = threading.Thread(target=self._watch, args=(pid, command), daemon=True)
                    self._watchers.append(watcher)
                    watcher.start()

    def _watch(self, pid: int, command: str) -> None:
        last = None
        while True:
            now = high_water_kib(pid)
            if now is None:
                break
            last = now
            time.sleep(POLL_SECONDS)
        with self._lock:
            if last is None:
                self.missed += 1
            else:
                self.kib.append(last)
                self.by_command.setdefault(command, []).append(last)
