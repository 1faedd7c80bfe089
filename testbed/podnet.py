"""What the end-to-end tests look at inside pod network namespaces: the rules there, and real TCP
traffic through them.

A "proxy" is a listener in the pod's netns on Envoy's ports (15001 outbound, 15006 inbound); it
answers every connection with its label and the connection's original destination
(SO_ORIGINAL_DST), which is exactly what Envoy reads after a REDIRECT. A client connecting from
the pod to an address outside it therefore gets "outbound|<that address>" back only when the
pod's rules delivered the connection to the proxy. Every address used lives in namespaces the
test made (the CNI node's bridge, the pod itself).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from testbed.cni import CniNode, Sandbox

OUTBOUND_PORT = 15001
INBOUND_PORT = 15006
ISTIO_CHAINS = ("ISTIO_OUTPUT", "ISTIO_INBOUND", "ISTIO_REDIRECT", "ISTIO_IN_REDIRECT")

_PROXY = r"""
import socket, struct, sys, threading
SO_ORIGINAL_DST = 80

def answer(conn, label):
    with conn:
        try:
            raw = conn.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
            port, addr = struct.unpack("!2xH4s8x", raw)
            dst = f"{socket.inet_ntoa(addr)}:{port}"
        except OSError:
            dst = "none"
        conn.sendall(f"{label}|{dst}".encode())

def serve(sock, label):
    while True:
        conn, _ = sock.accept()
        answer(conn, label)

for spec in sys.argv[1:]:
    port, label = spec.split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("0.0.0.0", int(port)))
    sock.listen(16)
    threading.Thread(target=serve, args=(sock, label), daemon=True).start()
print("ready", flush=True)
threading.Event().wait()
"""

_CLIENT = r"""
import socket, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3) as s:
        print(s.recv(256).decode())
except OSError as e:
    print(f"error|{type(e).__name__}")
"""


def enter(netns: str) -> list[str]:
    """The command prefix that runs in `netns`: a name under /run/netns or a path such as
    /proc/<pid>/ns/net."""
    if netns.startswith("/"):
        return ["nsenter", f"--net={netns}", "--"]
    return ["ip", "netns", "exec", netns]


def in_netns(netns: str, *argv: str, check: bool = True) -> str:
    done = subprocess.run(
        [*enter(netns), *argv], capture_output=True, text=True, timeout=30, check=False
    )
    if check and done.returncode != 0:
        raise AssertionError(
            f"in netns {netns}: {' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}"
        )
    return done.stdout


def saved_rules(netns: str) -> str:
    """iptables-save of the netns through both iptables flavours (the agent picks one)."""
    return in_netns(netns, "iptables-nft-save") + "\n" + in_netns(netns, "iptables-legacy-save")


def has_istio_rules(netns: str) -> bool:
    saved = saved_rules(netns)
    return any(f":{chain} " in saved for chain in ISTIO_CHAINS)


def pod_ip(add_result: dict[str, Any]) -> str:
    """The pod's IPv4 address from a CNI ADD result (bridge + host-local)."""
    for entry in add_result.get("ips") or []:
        address = str(entry["address"]).split("/")[0]
        if ":" not in address:
            return address
    raise AssertionError(f"no IPv4 address in ADD result {json.dumps(add_result)}")


@dataclass
class Proxy:
    netns: str
    proc: subprocess.Popen[str]


@contextmanager
def proxy_in(sandbox: Sandbox) -> Iterator[Proxy]:
    """Listeners on 15001 ("outbound") and 15006 ("inbound") in the pod's netns, stopped after."""
    proc = subprocess.Popen(
        [
            *enter(sandbox.netns_name),
            sys.executable,
            "-c",
            _PROXY,
            f"{OUTBOUND_PORT}:outbound",
            f"{INBOUND_PORT}:inbound",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        if line != "ready":
            proc.kill()
            _, err = proc.communicate()
            raise AssertionError(f"proxy in {sandbox.netns_name} did not start: {err.strip()}")
        yield Proxy(sandbox.netns_name, proc)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def connect(netns: str, host: str, port: int) -> str:
    """Connect from `netns` to host:port; what the other end said, or 'error|<exception>'."""
    return in_netns(netns, sys.executable, "-c", _CLIENT, host, str(port)).strip()


def call_plugin(
    cni_node: CniNode, sandbox: Sandbox, command: str, prev_result: dict[str, Any]
) -> tuple[int, dict[str, Any]]:
    """Exec our plugin as libcni does for the last entry of the chain: (exit code, stdout JSON).

    cnitool reports a failed plugin only by message; this shows the CNI error object itself.
    """
    conflist = json.loads(cni_node.conflist_path.read_text())
    entry = next(p for p in conflist["plugins"] if p.get("type") == "istio-cni")
    conf = {
        "cniVersion": conflist["cniVersion"],
        "name": conflist["name"],
        **entry,
        "prevResult": prev_result,
    }
    env = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": sandbox.infra_container_id,
        "CNI_NETNS": str(sandbox.netns_path),
        "CNI_IFNAME": "eth0",
        "CNI_PATH": str(cni_node.bin_dir),
        "CNI_ARGS": sandbox.cni_args(),
    }
    done = subprocess.run(
        [str(cni_node.bin_dir / "istio-cni")],
        input=json.dumps(conf),
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return done.returncode, (json.loads(done.stdout) if done.stdout.strip() else {})
