#!/usr/bin/python3
"""Test double of Envoy as Istio's pilot-agent runs it: installed as /usr/local/bin/envoy in the
test bed's proxy image, started by the real pilot-agent with Envoy's command line
(`-c /etc/istio/proxy/envoy-rev.json --drain-time-s 45 ...`).

It does what pilot-agent and the kubelet ask of Envoy, and nothing more:
- the capture listeners, 15001 (outbound), 15006 (inbound) and 15008 (HBONE), each connection
  answered and printed as proxy-double.py does (`proxy-double port=15001 peer=... original_dst=...`;
  pilot-agent passes Envoy's stdout through, so the lines are in the istio-proxy container log);
- the admin API on the address the bootstrap pilot-agent wrote names (`admin.address`, normally
  127.0.0.1:15000): `/stats` with the `filter` pilot-agent's readiness check sends, `/ready`,
  `/server_info`, `/stats/prometheus`, and the POSTs of a drain (`/drain_listeners`,
  `/healthcheck/fail`) and of a stop (`/quitquitquit`);
- the bootstrap's static HTTP listeners that route a path prefix to a static cluster, forwarding
  GETs there: 15021 `/healthz/ready` to pilot-agent's status port (15020), the readiness kubelet
  probes; 15090 `/stats/prometheus` to the admin API.

Its stats say what a real Envoy's say once istiod's first config is in: server LIVE, workers
started, one accepted CDS and LDS update. The double takes no config from istiod (nothing here
can run Envoy); it reports itself so only after its listeners are bound, which is what pilot-agent's
readiness on 15021 stands for.
"""

from __future__ import annotations

import http.client
import importlib.util
import json
import re
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import parse_qs, urlsplit

CAPTURE_PORTS = (15001, 15006, 15008)
DEFAULT_ADMIN = ("127.0.0.1", 15000)
# Each a counter or gauge Envoy has; the values of a LIVE Envoy that took its first config.
STATS = {
    "cluster_manager.cds.update_rejected": 0,
    "cluster_manager.cds.update_success": 1,
    "listener_manager.lds.update_rejected": 0,
    "listener_manager.lds.update_success": 1,
    "listener_manager.workers_started": 1,
    "server.state": 0,  # LIVE
}


def load_proxy_double() -> ModuleType:
    """proxy-double.py, beside this file (through the /usr/local/bin/envoy symlink)."""
    path = Path(__file__).resolve().with_name("proxy-double.py")
    spec = importlib.util.spec_from_file_location("proxy_double", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"envoy-double: cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


Address = tuple[str, int]
Routes = list[tuple[str, Address]]
"""(path prefix, the address of the cluster it routes to), in the listener's order."""


def bootstrap(argv: list[str]) -> dict[str, Any]:
    """The bootstrap named by `-c` (or `--config-path`); empty when there is none."""
    path = None
    for flag in ("-c", "--config-path"):
        if flag in argv[:-1]:
            path = argv[argv.index(flag) + 1]
    if path is None:
        return {}
    try:
        loaded = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        print(f"envoy-double: cannot read the bootstrap {path}: {e}", flush=True)
        return {}
    return loaded if isinstance(loaded, dict) else {}


def socket_address(node: Any) -> Address:
    address = node["socket_address"]
    return str(address["address"]), int(address["port_value"])


def admin_address(config: dict[str, Any]) -> Address:
    try:
        return socket_address(config["admin"]["address"])
    except (KeyError, TypeError, ValueError):
        return DEFAULT_ADMIN


def static_http_routes(config: dict[str, Any]) -> list[tuple[Address, Routes]]:
    """The static listeners whose HTTP connection manager routes path prefixes to static
    clusters with a TCP endpoint, each as (its address, its routes)."""
    resources = config.get("static_resources", {})
    clusters: dict[str, Address] = {}
    for cluster in resources.get("clusters", []):
        try:
            endpoint = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
            clusters[cluster["name"]] = socket_address(endpoint["address"])
        except (KeyError, IndexError, TypeError, ValueError):
            continue  # a unix socket or a dynamic cluster: nothing to forward to here
    found = []
    for listener in resources.get("listeners", []):
        try:
            address = socket_address(listener["address"])
            filters = [f for chain in listener["filter_chains"] for f in chain["filters"]]
        except (KeyError, TypeError, ValueError):
            continue
        routes: Routes = []
        for f in filters:
            hosts = f.get("typed_config", {}).get("route_config", {}).get("virtual_hosts", [])
            for route in (r for host in hosts for r in host.get("routes", [])):
                prefix = route.get("match", {}).get("prefix")
                target = clusters.get(route.get("route", {}).get("cluster", ""))
                if prefix is not None and target is not None:
                    routes.append((prefix, target))
        if routes:
            found.append((address, routes))
    return found


def stats_text(query: str) -> str:
    """`name: value` lines, as Envoy's /stats prints them, of the stats matching `filter`."""
    pattern = parse_qs(query).get("filter", [""])[0]
    try:
        wanted = re.compile(pattern)
    except re.error:
        return ""
    return "".join(f"{k}: {v}\n" for k, v in sorted(STATS.items()) if wanted.search(k))


class Admin(BaseHTTPRequestHandler):
    stop: threading.Event

    def answer(self, code: int, body: str, kind: str = "text/plain") -> None:
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        if url.path == "/stats":
            self.answer(200, stats_text(url.query))
        elif url.path == "/ready":
            self.answer(200, "LIVE\n")
        elif url.path == "/server_info":
            self.answer(200, json.dumps({"state": "LIVE"}), "application/json")
        elif url.path == "/stats/prometheus":
            self.answer(200, "")
        else:
            self.answer(404, f"envoy-double: no admin endpoint {url.path}\n")

    def do_POST(self) -> None:
        url = urlsplit(self.path)
        if url.path in ("/drain_listeners", "/healthcheck/fail", "/healthcheck/ok"):
            self.answer(200, "OK\n")
        elif url.path == "/quitquitquit":
            self.answer(200, "OK\n")
            self.stop.set()
        else:
            self.answer(404, f"envoy-double: no admin endpoint {url.path}\n")

    def log_message(self, format: str, *args: object) -> None:
        pass  # pilot-agent polls /stats every probe; its lines would bury the connection lines


class Forwarder(BaseHTTPRequestHandler):
    """One static listener: a GET whose path has a routed prefix goes to that cluster."""

    routes: Routes

    def do_GET(self) -> None:
        target = next((t for prefix, t in self.routes if self.path.startswith(prefix)), None)
        if target is None:
            self.send_error(404, f"envoy-double: no route for {self.path}")
            return
        upstream = http.client.HTTPConnection(*target, timeout=3)
        try:
            upstream.request("GET", self.path)
            answer = upstream.getresponse()
            code, body = answer.status, answer.read()
        except (OSError, http.client.HTTPException):
            code, body = 503, b"upstream connect error\n"  # Envoy's answer when a cluster is down
        finally:
            upstream.close()
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass  # a probe every second


def serve_http(address: Address, handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(address, handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main(argv: list[str]) -> int:
    proxy = load_proxy_double()
    stop_signals = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
    for port in CAPTURE_PORTS:
        for s in proxy.listen(port):
            threading.Thread(target=proxy.serve, args=(s, port), daemon=True).start()
    config = bootstrap(argv)
    stop = threading.Event()
    Admin.stop = stop
    admin = serve_http(admin_address(config), Admin)
    forwarded = []
    for address, routes in static_http_routes(config):
        handler = type("Listener", (Forwarder,), {"routes": routes})
        serve_http(address, handler)
        forwarded.append(f"{address[1]} ({', '.join(prefix for prefix, _ in routes)})")
    print(
        f"proxy-double listening on {' '.join(map(str, CAPTURE_PORTS))}, "
        f"admin on {admin.server_address[0]}:{admin.server_address[1]}"
        + (f", static listeners {'; '.join(forwarded)}" if forwarded else ""),
        flush=True,
    )
    # A signal or /quitquitquit ends it, whichever comes first.
    threading.Thread(target=lambda: (signal.sigwait(stop_signals), stop.set()), daemon=True).start()
    stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
