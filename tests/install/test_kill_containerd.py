"""What the real containerd (the test bed's, Debian's 1.6 with its CRI plugin) makes of each state a
kill can leave in the CNI conf dir while a single-plugin .conf becomes a .conflist.

containerd loads the first `max_conf_num` (1) files in name order and fails its whole CNI load on
any bad one (libcni: "error parsing configuration: missing 'type'" for a list in a .conf), so the
node's NetworkReady turns false and no pod starts. The CRI's Status (verbose) answers whether the
load worked and which network it loaded; this asks it over gRPC after each state.
"""

from __future__ import annotations

import json
import pathlib
import time
from collections.abc import Iterator

import grpc
import pytest

from agent.install import conflist
from testbed.containerd import Containerd, ContainerdDirs

pytestmark = pytest.mark.node

SINGLE = {
    "cniVersion": "1.0.0",
    "name": "net",
    "type": "bridge",
    "bridge": "cni0",
    "ipam": {"type": "host-local", "subnet": "10.22.0.0/16"},
}
OURS = {"type": "istio-cni", "kubernetes": {"kubeconfig": ""}}
LIST = conflist.insert(SINGLE, OURS)


def _fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """Top-level (field number, value) pairs of a protobuf message: varints and byte strings."""
    i = 0

    def varint() -> int:
        nonlocal i
        shift = value = 0
        while True:
            b = data[i]
            i += 1
            value |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return value

    while i < len(data):
        key = varint()
        if key & 7 == 0:
            yield key >> 3, varint()
        elif key & 7 == 2:
            n = varint()
            yield key >> 3, data[i : i + n]
            i += n
        else:
            raise ValueError(f"unexpected wire type {key & 7}")


def cri_status(socket: pathlib.Path) -> tuple[dict[str, tuple[bool, str]], dict[str, str]]:
    """The CRI's Status: {condition: (status, message)}, verbose info."""
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        call = channel.unary_unary(
            "/runtime.v1.RuntimeService/Status",
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b,
        )
        reply = call(b"\x08\x01", timeout=10)  # StatusRequest{verbose: true}
    conditions: dict[str, tuple[bool, str]] = {}
    info: dict[str, str] = {}
    for number, value in _fields(reply):
        assert isinstance(value, bytes)
        if number == 1:  # RuntimeStatus
            for n, cond in _fields(value):
                if n == 1 and isinstance(cond, bytes):
                    c = dict(_fields(cond))
                    conditions[bytes(c.get(1, b"")).decode()] = (
                        bool(c.get(2, 0)),
                        bytes(c.get(4, b"")).decode(),
                    )
        elif number == 2:  # map<string, string> info
            entry = dict(_fields(value))
            info[bytes(entry[1]).decode()] = bytes(entry[2]).decode()
    return conditions, info


@pytest.fixture
def containerd(tmp_path: pathlib.Path) -> Iterator[tuple[Containerd, pathlib.Path]]:
    conf_dir, bin_dir = tmp_path / "net.d", tmp_path / "bin"
    conf_dir.mkdir()
    bin_dir.mkdir()
    runtime = Containerd(
        ContainerdDirs(tmp_path / "containerd"),
        tmp_path / "containerd.log",
        prefix=[],
        sandbox_image="registry.invalid/pause:never-pulled",
        cni_bin_dir=bin_dir,
        cni_conf_dir=conf_dir,
    )
    runtime.start()
    try:
        yield runtime, conf_dir
    finally:
        runtime.stop()


def _network(runtime: Containerd, conf_dir: pathlib.Path, files: dict[str, object]) -> str:
    """Put exactly `files` in the conf dir; wait for containerd's reload; return its verdict:
    'ok <network name>' or 'failed: <its error>'."""
    for old in conf_dir.iterdir():
        old.unlink()
    for name, content in files.items():
        (conf_dir / name).write_text(json.dumps(content))
    deadline = time.monotonic() + 20
    verdict = ""
    while time.monotonic() < deadline:
        time.sleep(0.5)  # containerd reloads on the directory's inotify events
        conditions, info = cri_status(runtime.dirs.socket)
        ready, message = conditions["NetworkReady"]
        status = info.get("lastCNILoadStatus", "")
        config = json.loads(info.get("cniconfig", "{}"))
        loaded = [
            n["Config"]
            for n in config.get("Networks") or []
            if n["Config"]["Name"] != "cni-loopback"
        ]
        networks = [n["Name"] for n in loaded]
        plugin_types = [p["Network"]["type"] for n in loaded for p in n["Plugins"]]
        if ready and status == "OK":
            verdict = f"ok {','.join(networks)} {'+'.join(plugin_types)}"
        else:
            verdict = f"failed: {status or message}"
        if _settled(verdict, files):
            break
    return verdict


def _settled(verdict: str, files: dict[str, object]) -> bool:
    with_ours = any(conflist.count_ours(c) for c in files.values() if isinstance(c, dict))
    first = sorted(files)[0]
    expect_ours = bool(conflist.count_ours(files[first]))  # type: ignore[arg-type]
    return verdict.startswith("failed") or ("istio-cni" in verdict) == (expect_ours and with_ours)


def test_each_state_of_a_conversion(containerd: tuple[Containerd, pathlib.Path]) -> None:
    runtime, conf_dir = containerd
    seen = {}
    states: dict[str, dict[str, object]] = {
        "before: the provider's .conf": {"10-net.conf": SINGLE},
        "this order, middle: .conflist written, .conf not yet removed": {
            "10-net.conf": SINGLE,
            "10-net.conflist": LIST,
        },
        "after: the .conflist": {"10-net.conflist": LIST},
        "former order, middle: the list written into the .conf": {"10-net.conf": LIST},
    }
    for label, files in states.items():
        seen[label] = _network(runtime, conf_dir, files)
    print(json.dumps(seen, indent=1))
    assert seen["before: the provider's .conf"].startswith("ok net bridge")
    # Both present: containerd loads the .conf (first in name order), untouched and valid.
    assert seen["this order, middle: .conflist written, .conf not yet removed"].startswith(
        "ok net bridge"
    ), seen
    assert "istio-cni" not in seen["this order, middle: .conflist written, .conf not yet removed"]
    assert seen["after: the .conflist"] == "ok net bridge+istio-cni"
    # The state the former order left on a kill: containerd's whole load fails.
    former = seen["former order, middle: the list written into the .conf"]
    assert former.startswith("failed") and "missing 'type'" in former, former
