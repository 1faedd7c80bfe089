"""A static Envoy configuration that captures as Istio's sidecar does, for a real Envoy behind the
agent's rules (testbed/envoy_proc.py runs it).

What istiod sends a sidecar for traffic it has no Service for, reduced to that:
- `virtualOutbound` on 15001: the original_dst listener filter restores the destination the
  REDIRECT rewrote; tcp_proxy to `PassthroughCluster` (ORIGINAL_DST) connects to it.
- `virtualInbound` on 15006: the same to `InboundPassthroughCluster`, whose upstream binds to
  127.0.0.6 (::6) so the rules let Envoy's leg to the app through (`-o lo -s 127.0.0.6 -j
  RETURN`). In TPROXY mode the listener is `transparent` and the original_src listener filter
  (mark 1337) makes that leg leave from the client's own address, as Istio does.
- A connection addressed to 15001 or 15006 itself goes to `BlackHoleCluster` (Istio's guard
  against a loop through the capture port).
- 15021 answers /healthz/ready from Envoy's own readiness (the admin's /ready): Istio's
  readiness port, served there by pilot-agent, which is not run here.
- One access log file per capture listener (outbound.log, inbound.log), a JSON object a line
  naming its listener; or both on Envoy's stdout (`log_dir=None`), as the sidecar image
  (ci/build-testbed-images, `envoy`) runs it so the container log shows every leg.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent import constants

# The numbers the agent's rules are built from (agent.constants), so both sides agree.
OUTBOUND_PORT = int(constants.PROXY_OUTBOUND_PORT)
INBOUND_PORT = int(constants.PROXY_INBOUND_CAPTURE_PORT)
READINESS_PORT = 15021  # one of constants.ALWAYS_EXCLUDED_INBOUND: kubelet's probes reach it
ADMIN_PORT = 15000  # Istio's admin port, on 127.0.0.1 only
PROXY_UID = int(constants.PROXY_ID)
PROXY_GID = int(constants.PROXY_ID)
ORIGINAL_SRC_MARK = int(constants.TPROXY_MARK)  # Istio's original_src mark, the rules' fwmark
INBOUND_PASSTHROUGH_V4 = constants.INBOUND_PASSTHROUGH_V4.split("/")[0]
INBOUND_PASSTHROUGH_V6 = constants.INBOUND_PASSTHROUGH_V6.split("/")[0]
OUTBOUND_LOG = "outbound.log"
INBOUND_LOG = "inbound.log"
STDOUT = Path("/dev/stdout")
OUTBOUND_LISTENER = "virtualOutbound"
INBOUND_LISTENER = "virtualInbound"

PASSTHROUGH = "PassthroughCluster"
INBOUND_PASSTHROUGH = "InboundPassthroughCluster"
BLACKHOLE = "BlackHoleCluster"
ADMIN_CLUSTER = "admin"

# The access log's fields, by Envoy's command operators. DOWNSTREAM_LOCAL_ADDRESS is the
# original destination once original_dst has run.
LOG_FIELDS = {
    "downstream_remote": "%DOWNSTREAM_REMOTE_ADDRESS%",
    "downstream_local": "%DOWNSTREAM_LOCAL_ADDRESS%",
    "upstream_host": "%UPSTREAM_HOST%",
    "upstream_local": "%UPSTREAM_LOCAL_ADDRESS%",
    "cluster": "%UPSTREAM_CLUSTER%",
    "flags": "%RESPONSE_FLAGS%",
    "bytes_received": "%BYTES_RECEIVED%",
    "bytes_sent": "%BYTES_SENT%",
    "connection": "%CONNECTION_ID%",
}

TYPES = "type.googleapis.com/envoy.extensions"
HCM = "envoy.filters.network.http_connection_manager"


def _address(ip: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"address": ip, "port_value": port}}


def _access_log(path: Path, listener: str) -> list[dict[str, Any]]:
    return [
        {
            "name": "envoy.access_loggers.file",
            "typed_config": {
                "@type": f"{TYPES}.access_loggers.file.v3.FileAccessLog",
                "path": str(path),
                "log_format": {"json_format": {"listener": listener, **LOG_FIELDS}},
            },
        }
    ]


def _tcp_proxy(
    stat_prefix: str, cluster: str, log: Path | None, listener: str = ""
) -> dict[str, Any]:
    config: dict[str, Any] = {
        "@type": f"{TYPES}.filters.network.tcp_proxy.v3.TcpProxy",
        "stat_prefix": stat_prefix,
        "cluster": cluster,
    }
    if log is not None:
        config["access_log"] = _access_log(log, listener)
    return {"name": "envoy.filters.network.tcp_proxy", "typed_config": config}


def _capture_listener(
    name: str, port: int, cluster: str, log: Path, *, tproxy: bool, original_src: bool
) -> dict[str, Any]:
    """A capture port: the destination the rules rewrote is restored, then passed through; a
    connection addressed to the capture port itself is dropped (no loop)."""
    listener_filters: list[dict[str, Any]] = [
        {
            "name": "envoy.filters.listener.original_dst",
            "typed_config": {"@type": f"{TYPES}.filters.listener.original_dst.v3.OriginalDst"},
        }
    ]
    if original_src:
        listener_filters.append(
            {
                "name": "envoy.filters.listener.original_src",
                "typed_config": {
                    "@type": f"{TYPES}.filters.listener.original_src.v3.OriginalSrc",
                    "mark": ORIGINAL_SRC_MARK,
                },
            }
        )
    return {
        "name": name,
        "address": _address("0.0.0.0", port),
        "additional_addresses": [{"address": _address("::", port)}],
        "transparent": tproxy,
        "listener_filters": listener_filters,
        "filter_chains": [
            {
                "filter_chain_match": {"destination_port": port},
                "filters": [_tcp_proxy(BLACKHOLE, BLACKHOLE, None)],
            },
            {"filters": [_tcp_proxy(cluster, cluster, log, name)]},
        ],
    }


def _readiness_listener() -> dict[str, Any]:
    """15021 /healthz/ready -> the admin's /ready (200 once Envoy is LIVE)."""
    route = {
        "match": {"path": "/healthz/ready"},
        "route": {"cluster": ADMIN_CLUSTER, "prefix_rewrite": "/ready"},
    }
    hcm = {
        "@type": f"{TYPES}.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "readiness",
        "route_config": {"virtual_hosts": [{"name": "ready", "domains": ["*"], "routes": [route]}]},
        "http_filters": [
            {
                "name": "envoy.filters.http.router",
                "typed_config": {"@type": f"{TYPES}.filters.http.router.v3.Router"},
            }
        ],
    }
    return {
        "name": "readiness",
        "address": _address("0.0.0.0", READINESS_PORT),
        "filter_chains": [{"filters": [{"name": HCM, "typed_config": hcm}]}],
    }


def _original_dst_cluster(name: str, bind: bool) -> dict[str, Any]:
    cluster: dict[str, Any] = {
        "name": name,
        "type": "ORIGINAL_DST",
        "lb_policy": "CLUSTER_PROVIDED",
        "connect_timeout": "10s",
    }
    if bind:
        # Envoy picks the address of the destination's family.
        cluster["upstream_bind_config"] = {
            "source_address": {"address": INBOUND_PASSTHROUGH_V4, "port_value": 0},
            "extra_source_addresses": [
                {"address": {"address": INBOUND_PASSTHROUGH_V6, "port_value": 0}}
            ],
        }
    return cluster


def _admin_cluster() -> dict[str, Any]:
    endpoint = {"endpoint": {"address": _address("127.0.0.1", ADMIN_PORT)}}
    return {
        "name": ADMIN_CLUSTER,
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": {
            "cluster_name": ADMIN_CLUSTER,
            "endpoints": [{"lb_endpoints": [endpoint]}],
        },
    }


def sidecar_config(*, log_dir: Path | None, tproxy: bool = False) -> dict[str, Any]:
    """The bootstrap of a sidecar Envoy; access logs go to `log_dir`, or with None both to
    Envoy's stdout (each line names its listener). `tproxy`: the pod's interception mode is
    TPROXY (transparent listeners, original_src on inbound)."""
    outbound_log = log_dir / OUTBOUND_LOG if log_dir else STDOUT
    inbound_log = log_dir / INBOUND_LOG if log_dir else STDOUT
    return {
        "node": {"id": "sidecar~testbed", "cluster": "testbed"},
        "admin": {"address": _address("127.0.0.1", ADMIN_PORT)},
        "static_resources": {
            "listeners": [
                _capture_listener(
                    OUTBOUND_LISTENER,
                    OUTBOUND_PORT,
                    PASSTHROUGH,
                    outbound_log,
                    tproxy=tproxy,
                    original_src=False,
                ),
                _capture_listener(
                    INBOUND_LISTENER,
                    INBOUND_PORT,
                    INBOUND_PASSTHROUGH,
                    inbound_log,
                    tproxy=tproxy,
                    original_src=tproxy,
                ),
                _readiness_listener(),
            ],
            "clusters": [
                _original_dst_cluster(PASSTHROUGH, bind=False),
                _original_dst_cluster(INBOUND_PASSTHROUGH, bind=True),
                {"name": BLACKHOLE, "type": "STATIC", "connect_timeout": "10s"},
                _admin_cluster(),
            ],
        },
    }


IMAGE_BOOTSTRAP = "/etc/istio/proxy/envoy.json"
IMAGE_TPROXY_BOOTSTRAP = "/etc/istio/proxy/envoy-tproxy.json"
"""The sidecar image's two bootstraps (ci/image/envoy.Containerfile): its entrypoint runs the
first; a pod in TPROXY mode names the second (testbed/kubepods.envoy_container)."""
IMAGE_FLAGS = (
    "--disable-hot-restart", "--concurrency", "1", "--log-level", "warning",
    "--file-flush-interval-msec", "100",
)  # fmt: skip
"""The image entrypoint's flags after its bootstrap."""


if __name__ == "__main__":  # ci/build-testbed-images writes the sidecar image's bootstraps
    import json
    import sys

    json.dump(sidecar_config(log_dir=None, tproxy="--tproxy" in sys.argv), sys.stdout, indent=1)
    sys.stdout.write("\n")
