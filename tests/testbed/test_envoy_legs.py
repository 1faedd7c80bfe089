"""A call's legs named by role (testbed/envoy_legs.py): the same calls between pods of other IPs
and ephemeral ports record the same, and a leg one record lacks is named."""

from __future__ import annotations

from testbed import envoy
from testbed.envoy_legs import Call, Leg, Mesh, Recorded, differences, legs_of, role

PORTS = (8080,)
CALL = Call("mesh-client", "app", "mesh-server", 8080)


def mesh(client: str, server: str) -> Mesh:
    return Mesh(core=None, namespace="ns", ips={"mesh-client": client, "mesh-server": server})


def lines(client: str, server: str, port: int) -> dict[str, list[dict[str, str]]]:
    """One meshed -> meshed connection as both Envoys log it; `port` the ephemeral one."""
    out = {
        "listener": envoy.OUTBOUND_LISTENER,
        "cluster": envoy.PASSTHROUGH,
        "flags": "-",
        "downstream_remote": f"{client}:{port}",
        "downstream_local": f"{server}:8080",
        "upstream_local": f"{client}:{port + 1}",
        "upstream_host": f"{server}:8080",
        "bytes_received": "6",
    }
    inbound = {
        **out,
        "listener": envoy.INBOUND_LISTENER,
        "cluster": envoy.INBOUND_PASSTHROUGH,
        "downstream_remote": f"{client}:{port + 1}",
        "upstream_local": f"{envoy.INBOUND_PASSTHROUGH_V4}:{port + 2}",
    }
    other = {**out, "downstream_local": f"{server}:9090", "upstream_host": f"{server}:9090"}
    return {"mesh-client": [out, other], "mesh-server": [inbound]}


def test_addresses_are_named_by_role_and_only_a_servers_port_is_kept() -> None:
    m = mesh("10.0.0.5", "10.0.0.6")
    assert role(m, "10.0.0.5:41234", PORTS) == "mesh-client:*"
    assert role(m, "10.0.0.6:8080", PORTS) == "mesh-server:8080"
    assert role(m, "127.0.0.6:41235", PORTS) == "127.0.0.6:*"
    assert role(m, "-", PORTS) == "-"


def test_the_same_call_between_other_pods_records_the_same_legs() -> None:
    first = legs_of(mesh("10.0.0.5", "10.0.0.6"), CALL, lines("10.0.0.5", "10.0.0.6", 40000), PORTS)
    again = legs_of(
        mesh("10.0.1.7", "10.0.1.80"), CALL, lines("10.0.1.7", "10.0.1.80", 51000), PORTS
    )
    assert first == again
    assert sorted(first) == [
        Leg(
            "mesh-client",
            envoy.OUTBOUND_LISTENER,
            envoy.PASSTHROUGH,
            "-",
            "mesh-client:*",
            "mesh-server:8080",
            "mesh-client:*",
            "mesh-server:8080",
            "6",
        ),
        Leg(
            "mesh-server",
            envoy.INBOUND_LISTENER,
            envoy.INBOUND_PASSTHROUGH,
            "-",
            "mesh-client:*",
            "mesh-server:8080",
            "127.0.0.6:*",
            "mesh-server:8080",
            "6",
        ),
    ]  # fmt: skip  (the other call's leg, to port 9090, is not this call's)


def test_differences_name_each_leg_and_peer_not_all_records_hold() -> None:
    legs = legs_of(mesh("10.0.0.5", "10.0.0.6"), CALL, lines("10.0.0.5", "10.0.0.6", 40000), PORTS)
    full = {CALL: Recorded(legs, frozenset({"127.0.0.6:*"}))}
    inbound_only = frozenset(leg for leg in legs if leg.envoy == "mesh-server")
    short = {CALL: Recorded(inbound_only, frozenset({"mesh-client:*"}))}
    assert differences({"a": full, "b": full}) == ""
    found = differences({"a": full, "b": short}).splitlines()
    assert found[0] == f"{CALL}:"
    assert found[1:] == [
        "    only under a: leg mesh-client virtualOutbound PassthroughCluster flags=- "
        "mesh-client:* -> mesh-server:8080 | mesh-client:* -> mesh-server:8080 received=6",
        "    only under a: saw 127.0.0.6:*",
        "    only under b: saw mesh-client:*",
    ]
