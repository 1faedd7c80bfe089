"""The workload image's proxy double reports the original destination of a redirected connection,
IPv4 and IPv6, as Envoy would see it: run on this host in a network namespace of its own with an
iptables REDIRECT in front (the scripts are the ones the image ships, ci/image/)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from testbed.parts import REPO_ROOT

pytestmark = pytest.mark.netns

PROXY = str(REPO_ROOT / "ci/image/proxy-double.py")
APP = str(REPO_ROOT / "ci/image/app.py")


def sh(*argv: str) -> str:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    assert r.returncode == 0, f"{' '.join(argv)}: exit {r.returncode}: {r.stderr}"
    return r.stdout


@pytest.fixture
def netns() -> Iterator[str]:
    if os.geteuid() != 0:
        pytest.fail("needs root (network namespaces, iptables)")
    ns = f"image-doubles-{os.getpid()}"
    sh("ip", "netns", "add", ns)
    try:
        x = ("ip", "netns", "exec", ns)
        sh(*x, "ip", "link", "set", "lo", "up")
        # an interface with a default route through it: redirected traffic needs a route first
        sh(*x, "ip", "link", "add", "d0", "type", "veth", "peer", "name", "d1")
        sh(*x, "ip", "addr", "add", "192.0.2.1/24", "dev", "d0")
        sh(*x, "ip", "addr", "add", "2001:db8::1/64", "dev", "d0", "nodad")
        sh(*x, "ip", "link", "set", "d1", "up")
        sh(*x, "ip", "link", "set", "d0", "up")
        sh(*x, "ip", "route", "add", "default", "dev", "d0")
        sh(*x, "ip", "-6", "route", "add", "default", "dev", "d0")
        for tool, dst in (("iptables", "203.0.113.10"), ("ip6tables", "2001:db8:ffff::10")):
            sh(*x, tool, "-t", "nat", "-A", "OUTPUT", "-p", "tcp", "-d", dst, "--dport", "80",
               "-j", "REDIRECT", "--to-ports", "15001")  # fmt: skip
        yield ns
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)


def test_proxy_double_reports_original_destination(netns: str) -> None:
    x = ["ip", "netns", "exec", netns]
    proxy = subprocess.Popen(
        [*x, sys.executable, PROXY, "15001", "15006"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proxy.stdout is not None
        assert proxy.stdout.readline().startswith("proxy-double listening on 15001 15006")
        v4 = sh(*x, sys.executable, APP, "connect", "203.0.113.10", "80")
        v6 = sh(*x, sys.executable, APP, "connect", "2001:db8:ffff::10", "80")
        direct = sh(*x, sys.executable, APP, "connect", "127.0.0.1", "15006")
        assert "proxy-double port=15001 peer=" in v4 and "original_dst=203.0.113.10:80" in v4, v4
        assert "original_dst=[2001:db8:ffff::10]:80" in v6, v6
        # not redirected: the destination it was sent to (conntrack knows it, NAT being in use)
        assert "port=15006" in direct and "original_dst=127.0.0.1:15006" in direct, direct
        logged = [proxy.stdout.readline() for _ in range(3)]
        assert all(line.startswith("proxy-double port=") for line in logged), logged
    finally:
        proxy.terminate()
        proxy.communicate(timeout=10)


ENVOY = str(REPO_ROOT / "ci/image/envoy-double.py")
# The two queries pilot-agent's readiness check sends Envoy's admin (pilot/cmd/pilot-agent/status/
# util/stats.go), and what it then requires of the answers.
READY_QUERY = "/stats?usedonly&filter=^(server\\.state|listener_manager\\.workers_started)"
UPDATE_QUERY = (
    "/stats?usedonly&filter=^(cluster_manager\\.cds|listener_manager\\.lds)"
    "\\.(update_success|update_rejected)$"
)


# The parts of the bootstrap pilot-agent renders (tools/packaging/common/envoy_bootstrap.json)
# that the double reads: the admin address, the status listener and the `agent` cluster.
BOOTSTRAP = {
    "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 15990}}},
    "static_resources": {
        "clusters": [
            {
                "name": "agent",
                "type": "STATIC",
                "load_assignment": {
                    "cluster_name": "agent",
                    "endpoints": [
                        {
                            "lb_endpoints": [
                                {
                                    "endpoint": {
                                        "address": {
                                            "socket_address": {
                                                "protocol": "TCP",
                                                "address": "127.0.0.1",
                                                "port_value": 15920,
                                            }
                                        }
                                    }
                                }
                            ]
                        }
                    ],
                },
            },
            {"name": "xds-grpc", "type": "STATIC", "load_assignment": {"endpoints": []}},
        ],
        "listeners": [
            {
                "name": "0.0.0.0_15921",
                "address": {"socket_address": {"address": "0.0.0.0", "port_value": 15921}},
                "filter_chains": [
                    {
                        "filters": [
                            {
                                "name": "envoy.filters.network.http_connection_manager",
                                "typed_config": {
                                    "route_config": {
                                        "virtual_hosts": [
                                            {
                                                "name": "backend",
                                                "domains": ["*"],
                                                "routes": [
                                                    {
                                                        "match": {"prefix": "/healthz/ready"},
                                                        "route": {"cluster": "agent"},
                                                    }
                                                ],
                                            }
                                        ]
                                    }
                                },
                            }
                        ]
                    }
                ],
            }
        ],
    },
}
AGENT_STANDIN = """
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("agent saw " + self.path).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
s = http.server.HTTPServer(("127.0.0.1", 15920), H)
print("ready", flush=True)
s.serve_forever()
"""


def test_envoy_double_answers_what_pilot_agent_asks(netns: str, tmp_path) -> None:
    bootstrap = tmp_path / "envoy-rev.json"
    bootstrap.write_text(json.dumps(BOOTSTRAP))
    x = ["ip", "netns", "exec", netns]
    # Envoy's command line as pilot-agent writes it (pkg/envoy/proxy.go).
    argv = ["-c", str(bootstrap), "--drain-time-s", "45", "--drain-strategy", "immediate",
            "--local-address-ip-version", "v4", "--file-flush-interval-msec", "1000",
            "--disable-hot-restart", "--allow-unknown-static-fields", "-l", "warning"]  # fmt: skip
    envoy = subprocess.Popen([*x, sys.executable, ENVOY, *argv], stdout=subprocess.PIPE, text=True)
    get = [*x, sys.executable, "-c", "import sys, urllib.request as u; "
           "print(u.urlopen(u.Request('http://127.0.0.1:15990' + sys.argv[1], "
           "method=sys.argv[2])).read().decode(), end='')"]  # fmt: skip
    try:
        assert envoy.stdout is not None
        first = envoy.stdout.readline()
        assert first.startswith("proxy-double listening on 15001 15006 15008"), first
        assert "admin on 127.0.0.1:15990" in first, first
        assert "static listeners 15921 (/healthz/ready)" in first, first
        ready = dict(line.split(": ") for line in sh(*get, READY_QUERY, "GET").splitlines())
        assert ready == {"server.state": "0", "listener_manager.workers_started": "1"}, ready
        updates = dict(line.split(": ") for line in sh(*get, UPDATE_QUERY, "GET").splitlines())
        assert updates == {
            "cluster_manager.cds.update_success": "1",
            "cluster_manager.cds.update_rejected": "0",
            "listener_manager.lds.update_success": "1",
            "listener_manager.lds.update_rejected": "0",
        }, updates
        assert sh(*get, "/ready", "GET") == "LIVE\n"
        # kubelet's readiness probe: Envoy's 15021 listener forwards it to pilot-agent's 15020
        # (here a stand-in answering with the path it was asked).
        agent = subprocess.Popen([*x, sys.executable, "-c", AGENT_STANDIN], stdout=subprocess.PIPE)
        try:
            assert agent.stdout is not None and agent.stdout.readline() == b"ready\n"
            probe = [*get[:-1], get[-1].replace("15990", "15921")]
            assert sh(*probe, "/healthz/ready", "GET") == "agent saw /healthz/ready"
        finally:
            agent.kill()
            agent.communicate(timeout=10)
        captured = sh(*x, sys.executable, APP, "connect", "203.0.113.10", "80")
        assert "proxy-double port=15001" in captured and "203.0.113.10:80" in captured, captured
        assert sh(*get, "/quitquitquit", "POST") == "OK\n"
        assert envoy.wait(timeout=10) == 0
    finally:
        if envoy.poll() is None:
            envoy.terminate()
        envoy.communicate(timeout=10)
