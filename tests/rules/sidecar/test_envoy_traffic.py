"""Traffic all the way through a real Envoy behind the agent's rules: pods as network namespaces
on one bridge (testbed/meshnet.py), each meshed one with the rules the pod server programs for a
sidecar pod and Envoy configured as Istio's sidecar captures (testbed/envoy.py).

Each connection is followed by its addresses, leg by leg: the client's own local address is
what the first Envoy's outbound log names as downstream; that Envoy's upstream local address is
what the second Envoy's inbound log names as downstream; its upstream local address is the peer
the app saw. One line per leg and none elsewhere shows Envoy's own connections (the proxy's
user) were not captured again.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testbed import envoy as envoy_config
from testbed import parts
from testbed.envoy import INBOUND_LOG, OUTBOUND_LOG
from testbed.meshnet import APP_PORT, MeshBed, Pod

pytestmark = [pytest.mark.dataplane, pytest.mark.netns]

EXCLUDED_PORT = 9090
TPROXY = {"sidecar.istio.io/interceptionMode": "TPROXY"}


@pytest.fixture
def bed(request: pytest.FixtureRequest) -> Iterator[MeshBed]:
    """The pods' bed; parametrized indirectly with a rule backend, else the agent's default."""
    if os.geteuid() != 0:
        pytest.fail("the dataplane tier needs root (network namespaces, iptables)")
    try:
        parts.envoy().require()
    except parts.MissingPartError as e:
        pytest.fail(str(e), pytrace=False)
    backend = getattr(request, "param", None)
    with MeshBed(**({"backend": backend} if backend else {})) as made:
        yield made


def host_of(address: str) -> str:
    return address.rsplit(":", 1)[0]


def only_line(pod: Pod, log: str) -> dict[str, Any]:
    lines = pod.proxy.wait_log_lines(log, 1)
    assert len(lines) == 1, f"{pod.name} {log}: {lines}"
    return lines[0]


def assert_no_line(pod: Pod, log: str) -> None:
    # Envoy writes a line at the connection's close and flushes every 100 ms.
    lines = pod.proxy.wait_log_lines(log, 1, timeout=1.0)
    assert lines == [], f"{pod.name} {log} has lines: {lines}"


@pytest.mark.parametrize("tproxy", [False, True], ids=["redirect", "tproxy"])
def test_the_configuration_is_one_envoy_accepts(tmp_path: Path, tproxy: bool) -> None:
    binary = parts.envoy().require()
    path = tmp_path / "envoy.json"
    path.write_text(json.dumps(envoy_config.sidecar_config(log_dir=tmp_path, tproxy=tproxy)))
    done = subprocess.run(
        [str(binary), "--mode", "validate", "--config-path", str(path), "--disable-hot-restart"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


# The agent's default (auto: iptables-nft in a new netns), and the other two rule engines.
@pytest.mark.parametrize("bed", ["auto", "iptables-legacy", "nftables"], indirect=True)
def test_meshed_to_meshed_through_both_envoys(bed: MeshBed) -> None:
    a = bed.pod("a", meshed=True)
    b = bed.pod("b", meshed=True)

    answer, client = bed.get(a, b.ip, APP_PORT)

    assert answer["app"] == "b"
    out = only_line(a, OUTBOUND_LOG)
    assert out["downstream_remote"] == client  # the app's own connection, captured
    assert out["downstream_local"] == f"{b.ip}:{APP_PORT}"  # its original destination
    assert out["cluster"] == "PassthroughCluster"
    assert out["upstream_host"] == f"{b.ip}:{APP_PORT}"
    assert host_of(out["upstream_local"]) == a.ip
    inbound = only_line(b, INBOUND_LOG)
    assert inbound["downstream_remote"] == out["upstream_local"]  # from A's Envoy
    assert inbound["downstream_local"] == f"{b.ip}:{APP_PORT}"
    assert inbound["cluster"] == "InboundPassthroughCluster"
    assert host_of(inbound["upstream_local"]) == "127.0.0.6"
    assert answer["peer"] == inbound["upstream_local"]  # the app saw B's Envoy, from 127.0.0.6
    # Envoy's own connections (the proxy's user) were not captured again: one leg each.
    assert_no_line(a, INBOUND_LOG)
    assert_no_line(b, OUTBOUND_LOG)
    assert len(a.proxy.log_lines(OUTBOUND_LOG)) == 1
    assert len(b.proxy.log_lines(INBOUND_LOG)) == 1


def test_readiness_port_answers_uncaptured(bed: MeshBed) -> None:
    plain = bed.pod("plain", meshed=False)
    b = bed.pod("b", meshed=True)

    status = bed.run(plain, lambda: _status(b.ip, envoy_config.READINESS_PORT, "/healthz/ready"))

    assert status == 200
    assert_no_line(b, INBOUND_LOG)  # 15021 is left out of inbound capture


def _status(host: str, port: int, path: str) -> int:
    conn = http.client.HTTPConnection(host, port, timeout=5)
    try:
        conn.request("GET", path)
        return conn.getresponse().status
    finally:
        conn.close()


def test_meshed_to_plain(bed: MeshBed) -> None:
    a = bed.pod("a", meshed=True)
    plain = bed.pod("plain", meshed=False)

    answer, client = bed.get(a, plain.ip, APP_PORT)

    out = only_line(a, OUTBOUND_LOG)
    assert out["downstream_remote"] == client
    assert out["upstream_host"] == f"{plain.ip}:{APP_PORT}"
    assert answer == {
        "app": "plain",
        "peer": out["upstream_local"],  # A's Envoy, from A's address
        "local": f"{plain.ip}:{APP_PORT}",
    }
    assert host_of(answer["peer"]) == a.ip
    assert_no_line(a, INBOUND_LOG)


def test_plain_to_meshed(bed: MeshBed) -> None:
    plain = bed.pod("plain", meshed=False)
    b = bed.pod("b", meshed=True)

    answer, client = bed.get(plain, b.ip, APP_PORT)

    inbound = only_line(b, INBOUND_LOG)
    assert inbound["downstream_remote"] == client
    assert inbound["downstream_local"] == f"{b.ip}:{APP_PORT}"
    assert answer["app"] == "b"
    assert answer["peer"] == inbound["upstream_local"]
    assert host_of(answer["peer"]) == "127.0.0.6"
    assert_no_line(b, OUTBOUND_LOG)


def test_excluded_outbound_port_bypasses_envoy(bed: MeshBed) -> None:
    a = bed.pod(
        "a",
        meshed=True,
        annotations={"traffic.sidecar.istio.io/excludeOutboundPorts": str(EXCLUDED_PORT)},
    )
    plain = bed.pod("plain", meshed=False, ports=(APP_PORT, EXCLUDED_PORT))

    direct, client = bed.get(a, plain.ip, EXCLUDED_PORT)

    assert direct["peer"] == client  # nothing between the app and its peer
    assert_no_line(a, OUTBOUND_LOG)

    proxied, client = bed.get(a, plain.ip, APP_PORT)

    out = only_line(a, OUTBOUND_LOG)
    assert out["downstream_remote"] == client
    assert proxied["peer"] == out["upstream_local"] != client


def test_tproxy_app_sees_the_client_address(bed: MeshBed) -> None:
    a = bed.pod("a", meshed=True)
    b = bed.pod("b", meshed=True, annotations=TPROXY)

    answer, client = bed.get(a, b.ip, APP_PORT)

    out = only_line(a, OUTBOUND_LOG)
    assert out["downstream_remote"] == client
    inbound = only_line(b, INBOUND_LOG)
    assert inbound["downstream_remote"] == out["upstream_local"]
    assert inbound["downstream_local"] == f"{b.ip}:{APP_PORT}"
    assert answer["app"] == "b"
    # original_src: B's Envoy connected to its app from its client's address (A's, where A's
    # Envoy connected from); the port is Envoy's own (original_src does not keep ports).
    assert answer["peer"] == inbound["upstream_local"]
    assert host_of(answer["peer"]) == a.ip
    assert_no_line(b, OUTBOUND_LOG)
    assert len(b.proxy.log_lines(INBOUND_LOG)) == 1


def test_tproxy_from_a_plain_pod(bed: MeshBed) -> None:
    plain = bed.pod("plain", meshed=False)
    b = bed.pod("b", meshed=True, annotations=TPROXY)

    answer, client = bed.get(plain, b.ip, APP_PORT)

    inbound = only_line(b, INBOUND_LOG)
    assert inbound["downstream_remote"] == client
    assert answer["peer"] == inbound["upstream_local"]  # through B's Envoy
    assert host_of(answer["peer"]) == plain.ip  # from the client's own address
    assert_no_line(b, OUTBOUND_LOG)
