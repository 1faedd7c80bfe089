"""Find kubelet's UID: the node's probe SNAT rule in nftables matches probes by it (`skuid`).

nftables has no `--socket-exists`, so Istio matches the socket owner instead: the real UID of the
`kubelet` process (or MicroK8s' `kubelite`) found in the node's /proc, whose command line names
kubelet. Not found is an error: without it the rule cannot tell probes from other traffic.
"""

from __future__ import annotations

from pathlib import Path

from agent.errors import RedirectError

NAMES = ("kubelet", "kubelite")


def kubelet_uid(proc_dir: str = "/proc") -> str:
    """The real UID of the first kubelet (or kubelite) process in `proc_dir`."""
    root = Path(proc_dir)
    try:
        pids = sorted((p for p in root.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    except OSError as e:
        raise RedirectError(f"kubelet UID: cannot read {proc_dir}: {e.strerror}") from e
    for pid in pids:
        uid = _uid_if_kubelet(pid)
        if uid is not None:
            return uid
    raise RedirectError(f"kubelet UID: no kubelet or kubelite process in {proc_dir}")


def _uid_if_kubelet(pid: Path) -> str | None:
    try:  # a process may exit while we look: skip it
        if (pid / "comm").read_text().strip() not in NAMES:
            return None
        args = (pid / "cmdline").read_bytes().split(b"\0")
        if not any(b"kubelet" in arg.lower() for arg in args):
            return None
        for line in (pid / "status").read_text().splitlines():
            if line.startswith("Uid:"):
                return line.split()[1]  # real, effective, saved, filesystem: the real one
    except OSError:
        return None
    return None
