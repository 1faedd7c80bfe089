"""Reading a meshed pod's legs on the real node: its Envoy's access log (the `envoy` image logs
each connection as a JSON line on stdout, naming its listener) and its app's answers (app.py's
`connect` lines carry what the server's app saw)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from testbed import kubepods


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
