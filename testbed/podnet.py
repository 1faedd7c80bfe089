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
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from testbed.cni import CniNode, Sandbox

OUTBOUND_PORT = 15001
INBOUND_PORT = 15006
ISTIO_CHAINS = ("ISTIO_OUTPUT", "ISTIO_INBOUND", "ISTIO_REDIRECT", "ISTIO_IN_REDIRECT")
IPTABLES_VARIANTS = ("nft", "legacy")
COUNTERS = re.compile(r"\[\d+:\d+\]")

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


def non_empty_tables(save: str) -> list[str]:
    """-save output, counters and comments stripped, without tables that hold nothing: looking
    at a legacy table (Istio's plugin does, to pick its backend) makes the kernel create it
    empty."""
    kept: list[str] = []
    table: list[str] = []
    for line in save.splitlines():
        if line.startswith("#"):
            continue
        table.append(COUNTERS.sub("[0:0]", line))
        if line == "COMMIT":
            chains = [t for t in table if t.startswith(":")]
            if any(t.startswith("-A") for t in table) or any(
                not t.endswith(" ACCEPT [0:0]") for t in chains
            ):
                kept += table
            table = []
    return kept


SAVE_TOOLS = (
    "iptables-legacy-save",
    "ip6tables-legacy-save",
    "iptables-nft-save",
    "ip6tables-nft-save",
)


def saved_tables(netns: str) -> str:
    """Every non-empty table of the netns, through both families and both iptables variants,
    counters stripped: what the differentials compare between Istio's CNI and ours."""
    out = []
    for tool in SAVE_TOOLS:
        out.append(f"# {tool}")
        out += non_empty_tables(in_netns(netns, tool))
    return "\n".join(out)


# What the kernel counted so far: traffic-dependent, never part of a rule's meaning. `nft list`
# prints no handles without `-a`; they are dropped anyway in case a default ever changes.
NFT_COUNTERS = re.compile(r"\bcounter packets \d+ bytes \d+")
NFT_HANDLES = re.compile(r" # handle \d+$", re.MULTILINE)


def nft_ruleset(netns: str) -> str:
    """`nft list ruleset` in the namespace, counters and handles stripped, nothing else."""
    listed = in_netns(netns, "nft", "list", "ruleset")
    return NFT_HANDLES.sub("", NFT_COUNTERS.sub("counter", listed))


def iptables_in_use(netns: str) -> str:
    """ "nft" or "legacy": the iptables variant holding Istio's chains in `netns`."""
    for variant in IPTABLES_VARIANTS:
        saved = in_netns(netns, f"iptables-{variant}-save")
        if any(f":{chain} " in saved for chain in ISTIO_CHAINS):
            return variant
    raise AssertionError(f"no Istio chains in {netns} (iptables-nft or -legacy)")


def programmed_tables(netns: str, variant: str) -> list[str]:
    """Both families' non-empty tables in `netns`, through the given iptables variant."""
    return [
        *non_empty_tables(in_netns(netns, f"iptables-{variant}-save")),
        *non_empty_tables(in_netns(netns, f"ip6tables-{variant}-save")),
    ]


def restored_tables(restore_input: str, variant: str) -> list[str]:
    """What `iptables-<variant>-restore` of the text leaves in a new, empty network namespace,
    read back as programmed_tables reads a pod's: the tools' own spelling on both sides.
    The text holds the IPv4 tables, then (when there are any) the IPv6 ones, each ending in
    COMMIT, as `istio-cni-agent rules` prints them."""
    v4, v6 = _split_families(restore_input)
    script = (
        f'iptables-{variant}-restore < "$1" && ip6tables-{variant}-restore < "$2" && '
        f"iptables-{variant}-save && echo '# ipv6' && ip6tables-{variant}-save"
    )
    with tempfile.TemporaryDirectory() as tmp:
        paths = [f"{tmp}/v4", f"{tmp}/v6"]
        for path, text in zip(paths, (v4, v6), strict=True):
            with open(path, "w") as f:
                f.write(text)
        done = subprocess.run(
            ["unshare", "--net", "--", "sh", "-c", script, "sh", *paths],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
    if done.returncode != 0:
        raise AssertionError(f"iptables-{variant}-restore in a new netns: {done.stderr.strip()}")
    saved4, saved6 = done.stdout.split("# ipv6\n", 1)
    return [*non_empty_tables(saved4), *non_empty_tables(saved6)]


def _split_families(restore_input: str) -> tuple[str, str]:
    """(IPv4 tables, IPv6 tables): a table name seen again starts the IPv6 half."""
    lines = restore_input.splitlines(keepends=True)
    seen: set[str] = set()
    for i, line in enumerate(lines):
        if line.startswith("*"):
            if line in seen:
                return "".join(lines[:i]), "".join(lines[i:])
            seen.add(line)
    return restore_input, ""


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
