"""Istio's fixed numbers, each declared once: capture ports, proxy identity, marks, addresses.

Strings, as Istio's `istio-iptables` flags carry them and the renderers write them. The sidecar
and ambient (ztunnel) ports share numbers but not meaning, so each has its own name.
"""

from __future__ import annotations

from plugin.wire import SOCKET_NAME

__all__ = ["SOCKET_NAME"]  # the plugin's socket name, declared in the shared wire module

# -- sidecar capture (Istio's istio-iptables defaults) -----------------------------------------
PROXY_OUTBOUND_PORT = "15001"
"""Envoy's outbound listener: captured outbound TCP goes here (`--envoy-port`)."""
PROXY_INBOUND_CAPTURE_PORT = "15006"
"""Envoy's inbound listener: captured inbound TCP goes here (`--inbound-capture-port`)."""
PROXY_INBOUND_TUNNEL_PORT = "15008"
"""HBONE: inbound tunnel port, never captured (`--inbound-tunnel-port`)."""
PROXY_STATUS_PORT = "15020"
"""The sidecar's merged status/metrics port."""
ALWAYS_EXCLUDED_INBOUND = (PROXY_STATUS_PORT, "15021", "15090")
"""Status, health and Prometheus ports of the proxy: Istio always exempts them inbound."""
AGENT_DNS_PORT = "15053"
"""The sidecar agent's DNS proxy (ISTIO_META_DNS_CAPTURE)."""
IPTABLES_PROBE_PORT = "15002"
"""istio-iptables' probe port default (`--iptables-probe-port`)."""
PROXY_ID = "1337"
"""The proxy's UID and GID (istio-proxy) when nothing else names them."""
TPROXY_MARK = "1337"
"""fwmark of TPROXYed inbound packets (`--istio-inbound-tproxy-mark`)."""
TPROXY_ROUTE_TABLE = "133"
"""Policy routing table of TPROXY mode (`--istio-inbound-tproxy-route-table`)."""
OUTBOUND_MARK = "1338"
"""Mark on proxy-to-app packets over lo in TPROXY mode (Istio's OutboundMark)."""
INBOUND_PASSTHROUGH_V4 = "127.0.0.6/32"
"""Source address Envoy uses for inbound passthrough: never captured again."""
INBOUND_PASSTHROUGH_V6 = "::6/128"
LOOPBACK_V6 = "::1/128"

# -- ambient (ztunnel) -------------------------------------------------------------------------
ZTUNNEL_OUTBOUND_PORT = "15001"
ZTUNNEL_INBOUND_PLAINTEXT_PORT = "15006"
ZTUNNEL_INBOUND_PORT = "15008"
ZTUNNEL_DNS_PORT = "15053"
HOST_PROBE_SNAT_V4 = "169.254.7.127"
"""Address kubelet's probes to ambient pods are SNATed to (Istio's HOST_PROBE_SNAT_IP)."""
HOST_PROBE_SNAT_V6 = "fd16:9254:7127:1337:ffff:ffff:ffff:ffff"
"""The same for IPv6 (Istio's HOST_PROBE_SNAT_IPV6)."""
