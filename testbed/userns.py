"""A named network namespace owned by a user namespace of its own, as containerd 2 makes a
user-namespaced pod's (`hostUsers: false`): root inside is an unprivileged uid range outside.
Held by a `sleep` in both namespaces; the name and the process are gone at the end."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from testbed import netns
from testbed.wait import wait_for

FIRST_ID = 3_000_000_000
"""Outside ids of the namespace's 0..65535: far above any the machine or kubelet hands out."""
LENGTH = 65536


class UsernsNetns(NamedTuple):
    path: Path
    """/run/netns/<name>"""
    pid: int
    """The holder, in both namespaces."""

    def run_as(self, uid: int, argv: list[str]) -> subprocess.CompletedProcess[str]:
        """`argv` in both namespaces as `uid` (and gid) inside."""
        enter = ["nsenter", f"--user=/proc/{self.pid}/ns/user", f"--net={self.path}"]
        ids = [f"--setuid={uid}", f"--setgid={uid}"]
        return subprocess.run(
            [*enter, *ids, *argv], capture_output=True, text=True, timeout=30, check=False
        )


@contextlib.contextmanager
def userns_netns(prefix: str = "tb-userns") -> Iterator[UsernsNetns]:
    """A fresh network namespace owned by a fresh user namespace whose uid and gid maps are
    `0 FIRST_ID LENGTH`, with loopback up."""
    holder = subprocess.Popen(["unshare", "--user", "--net", "--", "sleep", "infinity"])
    name = netns.unique_name(prefix)
    try:
        own = os.stat("/proc/self/ns/user").st_ino
        wait_for(
            lambda: os.stat(f"/proc/{holder.pid}/ns/user").st_ino != own, "unshare's namespaces", 10
        )
        for kind in ("uid_map", "gid_map"):
            Path(f"/proc/{holder.pid}/{kind}").write_text(f"0 {FIRST_ID} {LENGTH}\n")
        netns.ip("netns", "attach", name, str(holder.pid))
        netns.ip("link", "set", "lo", "up", netns=name)
        yield UsernsNetns(netns.NETNS_DIR / name, holder.pid)
    finally:
        netns.delete(name)
        holder.kill()
        holder.wait()
