"""A stand-in for the node's /proc in Istio's agent pod, where this machine needs one.

Istio's ambient agent stats `/host/proc/1/ns/net` (the node's /proc, PID 1's network namespace)
when it starts, and exits when it cannot. On this machine PID 1 is the VM's init, whose
namespace links no process may read, root included. With `ambient.shareHostNetworkNamespace`
the agent runs in the node's network namespace and uses /proc/self for it; only that one stat
remains. So its `/host/proc` volume is pointed at a directory holding just `1/ns/net`, a symlink
to `/proc/self/ns/net`: resolved inside the agent's container, it names the agent's own network
namespace, the node's; and, for native nftables, a copy of the kubelet's comm, cmdline and status
(the agent looks for the kubelet's UID there). Istio's code and image are unchanged; only the
volume's source differs.

Also: Istio's chart mounts `cniNetnsDir` at /host/var/run/netns whatever its value, and its agent
opens a pod's namespace at /host + the runtime's path; the test bed's runtime keeps them under
its own dir, so that mount goes to /host + `cniNetnsDir`.

    install(..., post_renderer=post_renderer(cluster.base))

`python -m testbed.istio_procfs DIR` is the Helm post-renderer: manifests on stdin, the same on
stdout with the DaemonSet's hostPath /proc replaced by DIR and the netns dir mounted at its
own path under /host.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Any

import yaml

from testbed.parts import REPO_ROOT


def kubelet_pid(base: Path) -> int:
    """The test bed's kubelet (its command line names files under `base`)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "comm").read_text().strip() == "kubelet" and str(base).encode() in (
                entry / "cmdline"
            ).read_bytes():
                return int(entry.name)
        except OSError:
            continue
    raise AssertionError(f"no kubelet process of the node under {base}")


def standin(base: Path) -> Path:
    """The stand-in dir under `base`: `1/ns/net` -> /proc/self/ns/net, and a copy of the
    kubelet's comm, cmdline and status (with native nftables Istio's agent looks the kubelet's
    UID up there, to let its health checks through)."""
    root = base / "istio-procfs"
    link = root / "1" / "ns" / "net"
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.is_symlink():
        link.symlink_to("/proc/self/ns/net")
    pid = kubelet_pid(base)
    (root / str(pid)).mkdir(exist_ok=True)
    for name in ("comm", "cmdline", "status"):
        (root / str(pid) / name).write_bytes(Path(f"/proc/{pid}/{name}").read_bytes())
    return root


def post_renderer(base: Path) -> Path:
    """An executable for Helm's --post-renderer that points the /proc volume at the stand-in."""
    script = base / "istio-procfs-post-renderer"
    script.write_text(
        "#!/bin/sh\n"
        f"PYTHONPATH={shlex.quote(str(REPO_ROOT))} exec {shlex.quote(sys.executable)} "
        f"-m testbed.istio_procfs {shlex.quote(str(standin(base)))}\n"
    )
    script.chmod(0o755)
    return script


def redirect(doc: dict[str, Any], source: str) -> dict[str, Any]:
    if doc.get("kind") != "DaemonSet":
        return doc
    pod = doc["spec"]["template"]["spec"]
    netns_dir = None
    for volume in pod.get("volumes", []):
        if volume.get("hostPath", {}).get("path") == "/proc":
            volume["hostPath"] = {"path": source, "type": "Directory"}
        if volume["name"] == "cni-netns-dir":
            netns_dir = volume["hostPath"]["path"]
    # Istio's agent opens a pod's netns at /host + the path the runtime gave; its chart mounts
    # `cniNetnsDir` at /host/var/run/netns whatever its value, right only for the default.
    for container in pod["containers"]:
        for mount in container.get("volumeMounts", []):
            if mount["name"] == "cni-netns-dir" and netns_dir:
                mount["mountPath"] = "/host" + netns_dir
    return doc


def main() -> int:
    source = os.path.abspath(sys.argv[1])
    docs = [d for d in yaml.safe_load_all(sys.stdin) if d]
    yaml.safe_dump_all([redirect(d, source) for d in docs], sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
