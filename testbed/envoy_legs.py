"""Reading a meshed pod's legs on the real node: its Envoy's access log (the `envoy` image logs
each connection as a JSON line on stdout, naming its listener) and its app's answers (app.py's
`connect` lines carry what the server's app saw)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

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
