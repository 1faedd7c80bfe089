"""The pod-input parser and the rules it leads to: a pod manifest whose annotations, labels,
istio-proxy env and IPs come from the fuzzer, read as the agent reads a pod (agent.podinput
through the sidecar decision and capture settings, and ambient's per-pod overrides) and rendered
as iptables-restore input and as nftables commands.

Contract: a value the grammars refuse raises InvalidPodInputError; nothing else escapes; what is
rendered is printable ASCII, one command a line, each line one the rule formats have (so no
pod value can add a line, a table or a chain of its own)."""

from __future__ import annotations

import re
from typing import Any

import atheris

from agent.errors import InvalidPodInputError
from agent.podinput import pod as podinput
from agent.rules.ambient import nft as ambient_nft
from agent.rules.ambient.builder import pod_rules
from agent.rules.ambient.options import PodRuleOptions
from agent.rules.ambient.overrides import rule_options_for
from agent.rules.render_restore import render
from agent.rules.sidecar.builder import build
from agent.rules.sidecar.nft import render_native
from agent.rules.sidecar.pod import capture_config_for_pod, decide
from bench.doors.finding import Finding

ANNOTATIONS = [
    podinput.INJECT,
    podinput.STATUS,
    podinput.INTERCEPTION_MODE,
    podinput.INCLUDE_OUTBOUND_IP_RANGES,
    podinput.EXCLUDE_OUTBOUND_IP_RANGES,
    podinput.INCLUDE_INBOUND_PORTS,
    podinput.EXCLUDE_INBOUND_PORTS,
    podinput.INCLUDE_OUTBOUND_PORTS,
    podinput.EXCLUDE_OUTBOUND_PORTS,
    podinput.EXCLUDE_INTERFACES,
    podinput.KUBEVIRT_INTERFACES,
    podinput.REROUTE_VIRTUAL_INTERFACES,
    podinput.BYPASS_INBOUND_ANNOTATION,
    podinput.DNS_CAPTURE_ANNOTATION,
    "proxy.istio.io/config",
    "sidecar.istio.io/proxyUID",
    "sidecar.istio.io/proxyGID",
]
ENV = [
    podinput.DNS_CAPTURE_ENV,
    podinput.DUAL_STACK_ENV,
    podinput.INVALID_DROP_ENV,
    podinput.DISABLE_ENVOY_ENV,
]
SEEDS = [
    b"\x01\x0210.0.0.0/8,192.168.0.0/16\x00\x0315001,15006\x00",
    b"\x00*\x00\x01TPROXY\x00\x01true\x00",
    b"\x05eth1,eth2\x00\x0b8080\x00\x0c\x00\x0e1.2.3.4\x00fd00::1\x00",
]
CHAINS = r"(PREROUTING|INPUT|OUTPUT|POSTROUTING|FORWARD|ISTIO_[A-Z_]+)"
ALLOWED_RESTORE = re.compile(
    rf"^(\* ?(nat|mangle|raw|filter)|:{CHAINS} \S+ \[0:0\]|-[AINFX] {CHAINS}( .*)?|COMMIT|#.*)$"
)
ALLOWED_NFT = re.compile(r"^(add|insert|delete|flush|destroy|create|table|#) ?.*$")
NODE_OPTIONS = PodRuleOptions()
MAX_REFUSAL = 1024
"""A refusal names the input, an escaped excerpt and the reason: one line of at most this."""


def setup() -> None:
    pass


def pod_from(fdp: atheris.FuzzedDataProvider) -> dict[str, Any]:
    notes = {}
    for _ in range(fdp.ConsumeIntInRange(0, 6)):
        key = fdp.PickValueInList(ANNOTATIONS) if fdp.ConsumeBool() else fdp.ConsumeUnicode(20)
        notes[key] = fdp.ConsumeUnicode(fdp.ConsumeIntInRange(0, 120))
    env = [
        {"name": fdp.PickValueInList(ENV), "value": fdp.ConsumeUnicode(12)}
        for _ in range(fdp.ConsumeIntInRange(0, 3))
    ]
    proxy: dict[str, Any] = {"name": podinput.PROXY_CONTAINER, "image": "proxyv2", "env": env}
    if fdp.ConsumeBool():
        proxy["securityContext"] = {
            "runAsUser": fdp.ConsumeIntInRange(-5, 1 << 33),
            "runAsGroup": fdp.ConsumeIntInRange(-5, 1 << 33),
        }
    ips = [{"ip": fdp.ConsumeUnicode(40)} for _ in range(fdp.ConsumeIntInRange(0, 3))]
    return {
        "metadata": {
            "name": "fuzzed",
            "namespace": fdp.PickValueInList(["app", "kube-system", ""]),
            "uid": "u",
            "annotations": notes,
            "labels": {fdp.ConsumeUnicode(10): fdp.ConsumeUnicode(10)},
        },
        "spec": {
            "nodeName": "node",
            "containers": [{"name": "app", "image": "app"}, proxy][: fdp.ConsumeIntInRange(1, 2)],
        },
        "status": {"podIP": ips[0]["ip"] if ips else None, "podIPs": ips},
    }


def teardown() -> None:
    pass


def one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    pod = pod_from(fdp)
    ipv6 = fdp.ConsumeBool()
    try:
        if decide(pod, exclude_namespaces=("kube-system",)).redirect:
            config = capture_config_for_pod(pod, ipv6=ipv6)
            check_lines(render(build(config)), ALLOWED_RESTORE, "sidecar restore")
            check_lines(render_native(config), ALLOWED_NFT, "sidecar nft")
        options = rule_options_for(NODE_OPTIONS)(pod)
        check_lines(render(pod_rules(options)), ALLOWED_RESTORE, "ambient restore")
        check_lines(ambient_nft.render_pod(options), ALLOWED_NFT, "ambient nft")
        podinput.pod_ips(pod)
    except InvalidPodInputError as e:
        message = str(e)
        if len(message) > MAX_REFUSAL or any(c < " " or c == "\x7f" for c in message):
            raise Finding(f"refusal message not one bounded line: {message[:200]!r}") from e


def check_lines(text: str, allowed: re.Pattern[str], what: str) -> None:
    if not text.isascii() or any(c < " " and c != "\n" for c in text):
        raise Finding(f"{what}: control or non-ASCII character in the rules")
    for line in text.splitlines():
        if line and not allowed.match(line):
            raise Finding(f"{what}: unexpected line {line[:120]!r}")
