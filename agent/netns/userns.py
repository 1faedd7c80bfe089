"""The user namespace that owns a pod's network namespace, when it is not the agent's own.

A user-namespaced pod (`hostUsers: false`) on containerd 2 gets a network namespace made inside
the pod's user namespace, so owned by it. The kernel refuses an iptables owner match (`-m owner
--uid-owner 1337`, which every sidecar redirect has) written into such a namespace from another
user namespace (xt_owner's check: EINVAL, "RULE_APPEND failed (Invalid argument)"), and resolves
the uid it holds through the namespace's owner: written from inside, 1337 is the proxy's 1337 as
the pod sees it. So a program that writes rules there runs as the root of the owning namespace
(`enter_as_root`), as Istio's plugin does with `nsenter --user --net`; nftables' `meta skuid`
has no such check, but runs the same way.

setns(2) into a user namespace needs a single-threaded caller: it is done in the forked child
just before it runs the program, never in the agent's own threads.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import fcntl
import os
from collections.abc import Callable

CLONE_NEWUSER = 0x10000000
NS_GET_USERNS = 0xB701
"""ioctl(2) on a namespace file: a new descriptor of the user namespace that owns it."""
_OWN = "/proc/self/ns/user"
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def foreign_owner(netns_path: str) -> int | None:
    """An open descriptor (the caller closes it) of the user namespace owning the network
    namespace at `netns_path` when that is not the agent's own user namespace; else None. A
    namespace that cannot be opened is left to the caller's own open to report."""
    try:
        fd = os.open(netns_path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        owner = fcntl.ioctl(fd, NS_GET_USERNS)
    except OSError:  # an owner outside the agent's view: not one it can enter either
        return None
    finally:
        os.close(fd)
    own = os.stat(_OWN)
    seen = os.fstat(owner)
    if (seen.st_dev, seen.st_ino) == (own.st_dev, own.st_ino):
        os.close(owner)
        return None
    os.set_inheritable(owner, True)
    return owner


def enter_as_root(userns_fd: int) -> Callable[[], None]:
    """A subprocess `preexec_fn`: the child joins the user namespace at `userns_fd` as its root
    (uid and gid 0 inside), so the program it runs keeps every capability there."""

    def enter() -> None:
        if _libc.setns(userns_fd, CLONE_NEWUSER) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns(CLONE_NEWUSER): {os.strerror(err)}")
        with contextlib.suppress(OSError):  # refused where the namespace denies setgroups
            os.setgroups([])
        os.setresgid(0, 0, 0)
        os.setresuid(0, 0, 0)

    return enter
