"""Named network namespaces (`ip netns`), created and always deleted by the test bed."""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
from pathlib import Path
from typing import Any

from testbed.parts import SETUP_APT, MissingPartError

NETNS_DIR = Path("/run/netns")


def ip(*args: str, netns: str | None = None) -> str:
    """Run `ip [-n netns] args`; raise naming the command and its stderr on failure."""
    binary = shutil.which("ip")
    if binary is None:
        raise MissingPartError(
            f"test bed part 'ip' (iproute2) is missing; install it with {SETUP_APT}"
        )
    argv = [binary, *(("-n", netns) if netns else ()), *args]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def ip_json(*args: str, netns: str | None = None) -> list[dict[str, Any]]:
    """`ip -j ...` parsed: e.g. ip_json("addr", "show", "dev", "eth0", netns=ns)."""
    out = ip("-j", *args, netns=netns).strip()
    return list(json.loads(out)) if out else []


def unique_name(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(4)}"


def add(name: str) -> Path:
    """Create netns `name` with loopback up; returns its path."""
    ip("netns", "add", name)
    try:
        ip("link", "set", "lo", "up", netns=name)
    except Exception:
        delete(name)
        raise
    return NETNS_DIR / name


def delete(name: str) -> None:
    """Delete netns `name` (with every link in it); no error if it is already gone."""
    if (NETNS_DIR / name).exists():
        ip("netns", "delete", name)


def exists(name: str) -> bool:
    return (NETNS_DIR / name).exists()


def sysctl(name: str, key: str, value: str) -> None:
    """Set a per-namespace sysctl (`net.*`) in netns `name`."""
    argv = ["nsenter", f"--net={NETNS_DIR / name}", "--", "sysctl", "-q", "-w", f"{key}={value}"]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")


def delete_link(ifname: str) -> None:
    """Delete a link of the machine's namespace if it is there (a veth whose peer's netns was
    just deleted may go by itself meanwhile: the kernel tears the netns down in the background)."""

    def present() -> bool:
        return any(link.get("ifname") == ifname for link in ip_json("link", "show"))

    if present():
        try:
            ip("link", "delete", ifname)
        except RuntimeError:
            if present():
                raise
