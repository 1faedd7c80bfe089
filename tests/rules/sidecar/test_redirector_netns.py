"""ADD and CHECK through the handlers with the real redirect (RulesRedirector: host facts,
capture config, apply) into a real network namespace, for each rule backend."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from agent.config import Settings
from agent.rules.sidecar.redirector import RulesRedirector
from tests.podserver.helpers import InMemoryPods, build_rig, cni_body, make_pod

pytestmark = pytest.mark.netns

BACKENDS = ["iptables-nft", "iptables-legacy", "nftables"]


def nat_rules(path: Path, backend: str) -> str:
    if backend == "nftables":
        argv = ["nft", "list", "ruleset"]
    else:
        argv = [
            "iptables-legacy-save" if backend == "iptables-legacy" else "iptables-nft-save",
            "-t",
            "nat",
        ]
    tool = shutil.which(argv[0])
    assert tool, f"{argv[0]} is missing: install it with ci/setup-apt"
    done = subprocess.run(
        ["ip", "netns", "exec", path.name, tool, *argv[1:]],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


@pytest.mark.parametrize("backend", BACKENDS)
def test_add_then_check_in_a_real_netns(pod_netns: Path, backend: str) -> None:
    redirector = RulesRedirector(exclude_namespaces=Settings().excludeNamespaces, backend=backend)
    rig = build_rig(InMemoryPods(make_pod()), redirector)
    body = cni_body(netns=str(pod_netns))
    assert rig.handlers.check(cni_body("CHECK", netns=str(pod_netns))).status == 500  # none yet
    reply = rig.handlers.add(body)
    assert (reply.status, reply.body["result"]) == (200, "redirected"), reply.body
    assert backend in str(reply.body["reason"])
    # Istio's native nftables mode names its chains in lower case (`inet istio-proxy-nat`).
    chain = "istio-redirect" if backend == "nftables" else "ISTIO_REDIRECT"
    assert chain in nat_rules(pod_netns, backend)
    check = rig.handlers.check(cni_body("CHECK", netns=str(pod_netns)))
    assert (check.status, check.body["result"]) == (200, "redirected")
    again = rig.handlers.add(body)  # a retried ADD is idempotent
    assert again.body["result"] == "redirected"


def test_invalid_annotation_fails_the_add_and_leaves_no_rules(pod_netns: Path) -> None:
    pod = make_pod(annotations={"traffic.sidecar.istio.io/includeOutboundPorts": "eighty"})
    redirector = RulesRedirector(exclude_namespaces=(), backend="iptables-nft")
    rig = build_rig(InMemoryPods(pod), redirector)
    reply = rig.handlers.add(cni_body(netns=str(pod_netns)))
    assert reply.status == 500 and reply.body["code"] == 999
    assert "app/web-0" in str(reply.body["msg"])
    assert "includeOutboundPorts" in str(reply.body["msg"])
    assert "eighty" in str(reply.body["msg"])
    assert "ISTIO" not in nat_rules(pod_netns, "iptables-nft")


def test_missing_netns_is_an_error_naming_it() -> None:
    redirector = RulesRedirector(exclude_namespaces=(), backend="iptables-nft")
    rig = build_rig(InMemoryPods(make_pod()), redirector)
    reply = rig.handlers.add(cni_body(netns="/run/netns/does-not-exist-podsrv"))
    assert reply.status == 500 and reply.body["code"] == 999
    assert "/run/netns/does-not-exist-podsrv" in str(reply.body["msg"])
