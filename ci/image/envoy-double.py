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
  `/healthcheck/fail`) and of a stop (`/quitquitquit`).

Its stats say what a real Envoy's say once istiod's first config is in: server LIVE, workers
started, one accepted CDS and LDS update. The double takes no config from istiod (nothing here
can run Envoy); it reports itself so only after its listeners are bound, which is what pilot-agent's
readiness on 15021 stands for.
"""

from __future__ import annotations

import importlib.util
import json
import re
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
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


def admin_address(argv: list[str]) -> tuple[str, int]:
    """The admin address of the bootstrap named by `-c` (or `--config-path`)."""
    path = None
    for flag in ("-c", "--config-path"):
        if flag in argv[:-1]:
            path = argv[argv.index(flag) + 1]
    if path is None:
        return DEFAULT_ADMIN
    try:
        socket_address = json.loads(Path(path).read_text())["admin"]["address"]["socket_address"]
        return str(socket_address["address"]), int(socket_address["port_value"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"envoy-double: no admin address in {path} ({e}); using 15000", flush=True)
        return DEFAULT_ADMIN


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


def main(argv: list[str]) -> int:
    proxy = load_proxy_double()
    stop_signals = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
    for port in CAPTURE_PORTS:
        for s in proxy.listen(port):
            threading.Thread(target=proxy.serve, args=(s, port), daemon=True).start()
    stop = threading.Event()
    Admin.stop = stop
    admin = ThreadingHTTPServer(admin_address(argv), Admin)
    threading.Thread(target=admin.serve_forever, daemon=True).start()
    print(
        f"proxy-double listening on {' '.join(map(str, CAPTURE_PORTS))}, "
        f"admin on {admin.server_address[0]}:{admin.server_address[1]}",
        flush=True,
    )
    # A signal or /quitquitquit ends it, whichever comes first.
    threading.Thread(target=lambda: (signal.sigwait(stop_signals), stop.set()), daemon=True).start()
    stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
