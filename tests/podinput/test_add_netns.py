"""The real CNI ADD path refuses every hostile value of every pod-controlled input, on every rule
backend, and programs nothing: the namespace's `iptables-save` (both variants, both families),
`nft list ruleset`, policy rules and routes are byte-for-byte what they were.

Sidecar: the pod server's handlers with the real redirect (RulesRedirector). Ambient: the
handlers with the real enrollment and MeshDataplane over the real in-pod rules (InpodRules);
ztunnel, the API server's annotation and the node's probe set are the named fakes of
tests/ambient. One namespace per backend and mode; a valid pod ADDed last shows the same
snapshot does see rules that are programmed.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from agent.ambient.enroller import AmbientEnroller
from agent.ambient.mesh import MeshDataplane, rule_options_for
from agent.config import Settings
from agent.label_selectors import DEFAULT_ENABLEMENT_SELECTORS
from agent.podserver.handlers import PodHandlers
from agent.podserver.metrics import PluginMetrics
from agent.podserver.requests import Reply
from agent.podserver.sandboxes import SandboxStore
from agent.rules.ambient.apply import InpodRules
from agent.rules.ambient.options import PodRuleOptions
from agent.rules.sidecar.redirector import RulesRedirector
from plugin import wire
from tests.ambient.fakes import (
    FakeAnnotator,
    FakeHostProbeRules,
    FakeNetnsFinder,
    FakeZtunnelLink,
    Journal,
    namespace,
)
from tests.podinput.corpus import Manifest, Mode, ambient_pod, cases, refusal_problems, sidecar_pod
from tests.podserver.helpers import InMemoryPods, RealDecisions

pytestmark = [pytest.mark.hostile, pytest.mark.netns]

BACKENDS = ("iptables-legacy", "iptables-nft", "python-iptables", "nftables")
SNAPSHOT = (
    ("iptables-legacy-save",),
    ("ip6tables-legacy-save",),
    ("iptables-nft-save",),
    ("ip6tables-nft-save",),
    ("nft", "list", "ruleset"),
    ("ip", "-4", "rule"),
    ("ip", "-6", "rule"),
    ("ip", "-4", "route", "show", "table", "all"),
    ("ip", "-6", "route", "show", "table", "all"),
)


def snapshot(name: str) -> dict[str, str]:
    """What each tool lists in the namespace; iptables-save's `#` lines carry the time."""
    out: dict[str, str] = {}
    for argv in SNAPSHOT:
        tool = shutil.which(argv[0])
        assert tool, f"{argv[0]} is missing: install it with ci/setup-apt"
        done = subprocess.run(
            ["ip", "netns", "exec", name, tool, *argv[1:]],
            capture_output=True,
            text=True,
            check=False,
        )
        lines = [line for line in done.stdout.splitlines() if not line.startswith("#")]
        out[" ".join(argv)] = f"exit {done.returncode}\n" + "\n".join(lines)
    return out


def add_body(path: Path) -> bytes:
    prev = {"cniVersion": "1.0.0", "ips": [{"address": "10.1.2.3/24"}]}
    return wire.encode(
        wire.cni_request(
            command="ADD",
            container_id="c0ffee",
            netns=str(path),
            ifname="eth0",
            pod_name="web-0",
            pod_namespace="app",
            pod_uid="",
            cni_version="1.0.0",
            prev_result=prev,
        )
    )


class Namespaces:
    def get_namespace(self, name: str, *, retry: bool = True) -> dict[str, Any] | None:
        return namespace(name, {"istio.io/dataplane-mode": "ambient"})

    def read_namespace(self, name: str) -> dict[str, Any] | None:
        return self.get_namespace(name)


def handlers(mode: Mode, backend: str, pod: Manifest) -> PodHandlers:
    """The pod server's handlers for one pod, with the real rules of `mode` on `backend`."""
    common: dict[str, Any] = {
        "pods": InMemoryPods(pod),
        "sandboxes": SandboxStore(),
        "readiness": lambda: None,
        "metrics": PluginMetrics(CollectorRegistry()),
    }
    if mode == "sidecar":
        exclude = Settings().excludeNamespaces
        return PodHandlers(
            redirector=RulesRedirector(exclude_namespaces=exclude, backend=backend), **common
        )
    journal: Journal = []
    mesh = MeshDataplane(
        pod_rules=InpodRules(backend=backend),
        host_rules=FakeHostProbeRules(journal),
        ztunnel=FakeZtunnelLink(journal),
        annotator=FakeAnnotator(journal),
        find_netns=FakeNetnsFinder(journal),
        options_for=rule_options_for(PodRuleOptions(ipv6=False)),
    )
    enroller = AmbientEnroller(
        namespaces=Namespaces(),
        mesh=mesh,
        selectors=DEFAULT_ENABLEMENT_SELECTORS,
        exclude_namespaces=["kube-system"],
        system_namespace="istio-system",
        detection_retry=False,
    )
    return PodHandlers(redirector=RealDecisions(), ambient=enroller, **common)


def refusal(reply: Reply) -> str:
    """The reply's message and details as the runtime would show them."""
    return f"{reply.body.get('msg', '')} {reply.body.get('details', '')}"


@pytest.mark.parametrize("mode", ["sidecar", "ambient"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_hostile_values_program_nothing(pod_netns: Path, backend: str, mode: Mode) -> None:
    before = snapshot(pod_netns.name)
    body = add_body(pod_netns)
    problems: list[str] = []
    for item, name, value in cases(mode):
        reply = handlers(mode, backend, item.pod(value)).add(body)
        case = f"{item.id} = {name}"
        if reply.status < 400 or reply.result != "error":
            problems.append(f"{case}: not refused: {reply.status} {reply.body}")
            continue
        problems += [f"{case}: {p}" for p in refusal_problems(refusal(reply), item, value)]
    assert not problems, "\n".join(problems)
    after = snapshot(pod_netns.name)
    changed = [tool for tool in before if before[tool] != after[tool]]
    assert not changed, f"refused ADDs changed {changed}:\n" + "\n".join(after[t] for t in changed)

    valid = sidecar_pod() if mode == "sidecar" else ambient_pod()
    reply = handlers(mode, backend, valid).add(body)
    assert reply.status == 200, reply.body
    assert snapshot(pod_netns.name) != before, "a programmed pod must show in the snapshot"
