"""Reading a meshed pod's legs on the real node: its Envoy's access log (the `envoy` image logs
each connection as a JSON line on stdout, naming its listener) and its app's answers (app.py's
`connect` lines carry what the server's app saw).

    record()   what each call of a set produces from now on: every leg its connections leave in
               the Envoys' logs and the peer the server's app saw, addresses named by role
               (the pod holding the IP, 127.0.0.6; a port only where it is a server's), so that
               the same calls between fresh pods record the same
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from testbed import envoy, kubepods


@dataclass(frozen=True)
class Mesh:
    core: Any
    namespace: str
    ips: dict[str, str]
    """pod name -> its IP"""


def access_log(mesh: Mesh, pod: str) -> list[dict[str, str]]:
    """The access log lines of the pod's Envoy (its container log's JSON lines)."""
    text = kubepods.logs(mesh.core, mesh.namespace, pod, "istio-proxy")
    return [json.loads(s) for s in text.splitlines() if s.startswith("{")]


def wait_leg(mesh: Mesh, pod: str, listener: str, **fields: str) -> dict[str, str]:
    """The first access log line of the pod's Envoy on `listener` whose fields start with
    `fields`' values (an address 'IP:' matches any port)."""

    def check() -> dict[str, str] | None:
        for line in access_log(mesh, pod):
            if line["listener"] == listener and all(
                str(line.get(k, "")).startswith(v) for k, v in fields.items()
            ):
                return line
        return None

    line: dict[str, str] = kubepods.wait_for(
        check,
        f"a {listener} leg {fields} in the access log of {pod}",
        60,
        interval=0.5,
        on_timeout=lambda: "\n".join(map(str, access_log(mesh, pod)[-10:])),
    )
    return line


def answer(mesh: Mesh, pod: str, container: str, server: str, port: int) -> str:
    """The first answer the pod's app got from `server`'s app on `port`."""
    target = f"connect {mesh.ips[server]}:{port} app port={port} "
    return kubepods.wait_log_line(
        mesh.core, mesh.namespace, pod, container, lambda s: target in s, f"an answer ({target})"
    )


def assert_meshed_to_meshed(mesh: Mesh, client: str, server: str, port: int) -> None:
    """`client`'s app called `server`'s app on `port` through both pods' Envoys: its answer came
    back from the server's app, which saw the connection from Envoy's inbound passthrough; the
    client Envoy's outbound leg went to the server's address, and the server Envoy's inbound
    leg of that very connection (the client Envoy's source address and port) went to its app,
    which saw that leg's own source."""
    client_ip, server_ip = mesh.ips[client], mesh.ips[server]
    line = answer(mesh, client, "app", server, port)
    assert f"peer={envoy.INBOUND_PASSTHROUGH_V4}:" in line and "echo=hello" in line, line
    out = wait_leg(
        mesh,
        client,
        envoy.OUTBOUND_LISTENER,
        downstream_remote=f"{client_ip}:",
        upstream_host=f"{server_ip}:{port}",
        flags="-",  # the app's answer came through a leg that connected; earlier tries may not
    )
    assert out["cluster"] == envoy.PASSTHROUGH and out["flags"] == "-", out
    inbound = wait_leg(
        mesh,
        server,
        envoy.INBOUND_LISTENER,
        downstream_remote=out["upstream_local"],
        downstream_local=f"{server_ip}:{port}",
        upstream_host=f"{server_ip}:{port}",
        upstream_local=f"{envoy.INBOUND_PASSTHROUGH_V4}:",
    )
    assert inbound["cluster"] == envoy.INBOUND_PASSTHROUGH and inbound["flags"] == "-", inbound
    seen = f"app port={port} peer={inbound['upstream_local']}"
    kubepods.wait_log_line(mesh.core, mesh.namespace, server, "app", lambda s: seen in s, seen)


@dataclass(frozen=True)
class Call:
    """`client`'s container calling `server`'s app on `port` in a loop (app.py connect-loop)."""

    client: str
    container: str
    server: str
    port: int

    def __str__(self) -> str:
        return f"{self.client}/{self.container} -> {self.server}:{self.port}"


class Leg(NamedTuple):
    """One access log line of a call's connection, its addresses as roles (role())."""

    envoy: str
    """the pod whose Envoy logged it"""
    listener: str
    cluster: str
    flags: str
    downstream_remote: str
    downstream_local: str
    """the original destination"""
    upstream_local: str
    upstream_host: str
    bytes_received: str

    def __str__(self) -> str:
        return (
            f"{self.envoy} {self.listener} {self.cluster} flags={self.flags} "
            f"{self.downstream_remote} -> {self.downstream_local} | "
            f"{self.upstream_local} -> {self.upstream_host} received={self.bytes_received}"
        )


@dataclass(frozen=True)
class Recorded:
    legs: frozenset[Leg]
    seen: frozenset[str]
    """the peers the server's app answered it saw, as roles ("error" for a failed connection)"""


PEER = re.compile(r" peer=(\S+)")


def role(mesh: Mesh, address: str, ports: Collection[int]) -> str:
    """`address` ('IP:port' as Envoy and app.py write it) with its IP named by the pod holding it
    (others as they are: 127.0.0.6) and its port kept only when one of `ports`, a server's
    (an ephemeral one is '*')."""
    ip, sep, port = address.rpartition(":")
    if not sep:
        return address  # "-": no upstream
    names = {v: k for k, v in mesh.ips.items()}
    who = names.get(ip.strip("[]"), ip)
    return f"{who}:{port}" if port.isdigit() and int(port) in ports else f"{who}:*"


def legs_of(
    mesh: Mesh, call: Call, lines: dict[str, list[dict[str, str]]], ports: Collection[int]
) -> frozenset[Leg]:
    """The legs among `lines` (pod -> its Envoy's access log) of `call`'s connections: those
    from the client's address to the server's IP:port as its original destination."""
    source, destination = mesh.ips[call.client], f"{mesh.ips[call.server]}:{call.port}"
    found = set()
    for pod in (call.client, call.server):
        for line in lines.get(pod, []):
            if (
                line["downstream_local"] == destination
                and line["downstream_remote"].rpartition(":")[0] == source
            ):
                found.add(
                    Leg(
                        envoy=pod,
                        listener=line["listener"],
                        cluster=line["cluster"],
                        flags=line["flags"],
                        downstream_remote=role(mesh, line["downstream_remote"], ports),
                        downstream_local=role(mesh, line["downstream_local"], ports),
                        upstream_local=role(mesh, line["upstream_local"], ports),
                        upstream_host=role(mesh, line["upstream_host"], ports),
                        bytes_received=str(line["bytes_received"]),
                    )
                )
    return frozenset(found)


def results(mesh: Mesh, call: Call) -> list[str]:
    """What `call`'s loop printed for each connection, in order (an answer or an error)."""
    target = f"connect {mesh.ips[call.server]}:{call.port} "
    text = kubepods.logs(mesh.core, mesh.namespace, call.client, call.container)
    return [s for s in text.splitlines() if target in s]


def has_envoy(mesh: Mesh, pod: str) -> bool:
    spec = mesh.core.read_namespaced_pod(pod, mesh.namespace).spec
    return any(c.name == "istio-proxy" for c in spec.containers)


def _grown(mesh: Mesh, counts: dict[str, int], by: int) -> bool:
    return all(len(access_log(mesh, pod)) >= n + by for pod, n in counts.items())


def record(
    mesh: Mesh, calls: Sequence[Call], ports: Collection[int], connections: int = 3
) -> dict[Call, Recorded]:
    """What each of `calls` produces from now on, over its next `connections` connections and
    every line the Envoys on their way log meanwhile. Each call has answered once first (the
    pods' Envoys are up). The Envoys of `calls` must carry steady traffic: each log is written
    in order, so two lines past a point mean every connection closed before it is there."""
    for call in calls:
        answer(mesh, call.client, call.container, call.server, call.port)
    pods = sorted({c.client for c in calls} | {c.server for c in calls})
    envoys = {pod: len(access_log(mesh, pod)) for pod in pods if has_envoy(mesh, pod)}
    kubepods.wait_for(lambda: _grown(mesh, envoys, 2), "two more lines in each Envoy's log", 30)
    start = {pod: len(access_log(mesh, pod)) for pod in envoys}
    before = {call: len(results(mesh, call)) for call in calls}
    kubepods.wait_for(
        lambda: all(len(results(mesh, c)) >= before[c] + connections for c in calls),
        f"{connections} more connections of each call",
        30 + 2 * connections,
        interval=0.5,
    )
    seen = {call: results(mesh, call)[before[call] :] for call in calls}
    done = {pod: len(access_log(mesh, pod)) for pod in envoys}
    kubepods.wait_for(lambda: _grown(mesh, done, 2), "two more lines in each Envoy's log", 30)
    lines = {pod: access_log(mesh, pod)[n:] for pod, n in start.items()}
    return {
        call: Recorded(legs_of(mesh, call, lines, ports), _peers(mesh, seen[call], ports))
        for call in calls
    }


def _peers(mesh: Mesh, answers: Iterable[str], ports: Collection[int]) -> frozenset[str]:
    return frozenset(
        role(mesh, m.group(1), ports) if (m := PEER.search(s)) else "error" for s in answers
    )


def describe(records: dict[Call, Recorded]) -> str:
    """One block per call: the peer its server's app saw, then its legs."""
    out = []
    for call, rec in records.items():
        out.append(f"{call}: the server's app saw {', '.join(sorted(rec.seen))}")
        out += [f"    {leg}" for leg in sorted(rec.legs)] or ["    (no leg through an Envoy)"]
    return "\n".join(out)


def differences(
    records: dict[str, dict[Call, Recorded]],
) -> str:
    """Where the records (name -> record()) differ, call by call: each leg and each peer seen
    that not all of them hold, with the names holding it; "" when they are the same."""
    out = []
    calls = sorted({c for rec in records.values() for c in rec}, key=str)
    for call in calls:
        held: dict[str, list[str]] = {}
        for name, rec in records.items():
            got = rec.get(call, Recorded(frozenset(), frozenset()))
            for item in [f"leg {leg}" for leg in got.legs] + [f"saw {p}" for p in got.seen]:
                held.setdefault(item, []).append(name)
        odd = sorted((item, names) for item, names in held.items() if len(names) < len(records))
        if odd:
            out.append(f"{call}:")
            out += [f"    only under {', '.join(names)}: {item}" for item, names in odd]
    return "\n".join(out)
