"""Seeded random pods as Istio's injector (or a user) leaves them, for the differentials that run
Istio's CNI and ours on the same pods: tests/differential/test_istio_cni_pods.py (the plugins on
sandboxes) and tests/node/test_istio_node_agent.py (the node agents on a real node)."""

from __future__ import annotations

import random
from typing import Any


def random_pod(rng: random.Random) -> dict[str, Any]:
    """Annotations, labels, proxy env, args, placement and security context, each drawn from
    values users (or Istio's injector) write, including the ones that make Istio skip a pod."""
    annotations = {"sidecar.istio.io/status": '{"containers":["istio-proxy"]}'}
    if rng.random() < 0.05:
        del annotations["sidecar.istio.io/status"]
    choices = {
        "sidecar.istio.io/interceptionMode": ["REDIRECT", "TPROXY"],
        "traffic.sidecar.istio.io/includeOutboundIPRanges": [
            "*",
            "10.0.0.0/8,172.16.0.0/12",
            "",
            "127.0.0.0/8,10.0.0.0/8",
            "10.0.0.0/8,fd00::/8",
        ],
        "traffic.sidecar.istio.io/excludeOutboundIPRanges": [
            "1.1.1.1/32",
            "10.96.0.0/12",
            "fd00:10::/64,1.1.1.1/32",
        ],
        "traffic.sidecar.istio.io/includeInboundPorts": ["*", "8080,9090", "", "8080,8080"],
        "traffic.sidecar.istio.io/excludeInboundPorts": [
            "8081",
            "15020,9000",
            "9000,",
            "8080, 15021",
            "9000,9000",
        ],
        "traffic.sidecar.istio.io/includeOutboundPorts": ["3306", "5432,6379", "3306, 3306"],
        "traffic.sidecar.istio.io/excludeOutboundPorts": ["443", "8443,9443"],
        "traffic.sidecar.istio.io/excludeInterfaces": ["eth1", "net1,net2"],
        "traffic.sidecar.istio.io/kubevirtInterfaces": ["net1"],
        "istio.io/reroute-virtual-interfaces": ["net3", "net1,net4"],
        "sidecar.istio.io/inject": ["true", "false"],
    }
    for key, values in choices.items():
        if rng.random() < 0.3:
            annotations[key] = rng.choice(values)
    labels = (
        {"sidecar.istio.io/inject": rng.choice(["true", "false"])} if rng.random() < 0.1 else {}
    )
    env = [
        {"name": n, "value": rng.choice(["true", "false"])}
        for n in ("ISTIO_META_DNS_CAPTURE", "INVALID_DROP", "ISTIO_DUAL_STACK")
        if rng.random() < 0.35
    ]
    if rng.random() < 0.05:
        env.append({"name": "DISABLE_ENVOY", "value": "true"})
    proxy: dict[str, Any] = {
        "name": "istio-proxy",
        "image": "registry.invalid/proxyv2:1",
        "env": env,
    }
    if rng.random() < 0.2:
        proxy["args"] = ["proxy", rng.choice(["sidecar", "sidecar", "router"])]
    security: dict[str, Any] = {}
    if rng.random() < 0.4:
        security["runAsUser"] = rng.choice([1337, 1000, 101, 0])
    if rng.random() < 0.3:
        security["runAsGroup"] = rng.choice([1337, 2000])
    if security:
        proxy["securityContext"] = security
    app: dict[str, Any] = {"name": "app", "image": "registry.invalid/app:1"}
    if rng.random() < 0.5:
        app["ports"] = [{"containerPort": rng.choice([8080, 9090, 3000])}]
    spec: dict[str, Any] = {
        "annotations": annotations,
        "labels": labels,
        "containers": [app, proxy],
    }
    if rng.random() < 0.2:  # a native sidecar: Kubernetes 1.28+ injection
        spec["containers"] = [app]
        spec["init_containers"] = [{**proxy, "restartPolicy": "Always"}]
    elif rng.random() < 0.04:  # injected the old way: istio-init already wrote the rules
        spec["init_containers"] = [{"name": "istio-init", "image": "registry.invalid/proxyv2:1"}]
    return spec
