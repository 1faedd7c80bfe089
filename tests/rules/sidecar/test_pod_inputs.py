"""Every pod input of Istio's sidecar CNI plugin (cni/pkg/plugin: plugin.go, kubernetes.go,
sidecar_redirect.go, sidecar_iptables_linux.go), input by input, through the real decision code
(agent.rules.sidecar.pod) on pod manifests, and `rules --pod` following the same decisions."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.errors import InvalidAnnotationError
from agent.rules.sidecar.pod import capture_config_for_pod, decide, ipv6_for_pod, pod_ips
from tests.rules.conftest import run_rules

STATUS = {"sidecar.istio.io/status": "{}"}


def sidecar_pod(
    *,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
    proxy: dict[str, Any] | None = None,
    pod_ips: list[str] | None = None,
    native: bool = False,
) -> dict[str, Any]:
    """An injected pod; `proxy` merges into the istio-proxy container."""
    container: dict[str, Any] = {"name": "istio-proxy", "args": ["proxy", "sidecar"]}
    if env is not None:
        container["env"] = [{"name": k, "value": v} for k, v in env.items()]
    container.update(copy.deepcopy(proxy or {}))
    spec: dict[str, Any] = {"containers": [{"name": "app"}]}
    if native:
        spec["initContainers"] = [{**container, "restartPolicy": "Always"}]
    else:
        spec["containers"].append(container)
    manifest: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "p",
            "namespace": "app",
            "labels": dict(labels or {}),
            "annotations": {**STATUS, **(annotations or {})},
        },
        "spec": spec,
    }
    if pod_ips is not None:
        manifest["status"] = {"podIPs": [{"ip": ip} for ip in pod_ips]}
    return manifest


def config(manifest: dict[str, Any]) -> Any:
    return capture_config_for_pod(manifest, ipv6=False)


# --- IPv6: ISTIO_DUAL_STACK and the pod's addresses --------------------------------------------

V4 = ["127.0.0.1", "10.244.0.5", "::1", "fe80::1"]
V6 = ["127.0.0.1", "::1", "fd00:10:244::5", "fe80::1"]
DUAL = ["127.0.0.1", "10.244.0.5", "::1", "fd00:10:244::5", "fe80::1"]
DUAL_V6_FIRST = ["fd00:10:244::5", "10.244.0.5"]  # an IPv6-primary cluster's podIPs order


@pytest.mark.parametrize(
    ("addresses", "env", "ipv6"),
    [
        (V4, {}, False),
        (V4, {"ISTIO_DUAL_STACK": "true"}, False),
        (V6, {}, True),
        (V6, {"ISTIO_DUAL_STACK": "false"}, True),
        (DUAL, {"ISTIO_DUAL_STACK": "true"}, True),
        (DUAL, {"ISTIO_DUAL_STACK": "1"}, True),
        (DUAL, {"ISTIO_DUAL_STACK": "T"}, True),
        (DUAL, {}, False),
        (DUAL, {"ISTIO_DUAL_STACK": "false"}, False),
        (DUAL, {"ISTIO_DUAL_STACK": "yes"}, False),  # ParseBool fails: a warning, off
        (DUAL, {"ISTIO_DUAL_STACK": ""}, False),
        (DUAL_V6_FIRST, {}, False),  # Go lists IPv4 addresses first
        (DUAL_V6_FIRST, {"ISTIO_DUAL_STACK": "true"}, True),
        (["::ffff:10.0.0.5", "fd00::5"], {}, False),  # IPv4-mapped: an IPv4 address to Istio
        (["127.0.0.1", "::1", "fe80::1"], {"ISTIO_DUAL_STACK": "true"}, False),
    ],
    ids=[
        "v4",
        "v4-dual-env",
        "v6",
        "v6-dual-false",
        "dual-true",
        "dual-1",
        "dual-T",
        "dual-unset",
        "dual-false",
        "dual-unparsable",
        "dual-empty",
        "v6-first-unset",
        "v6-first-true",
        "v4-mapped",
        "link-local-only",
    ],
)
def test_ipv6_decision(addresses: list[str], env: dict[str, str], ipv6: bool) -> None:
    assert ipv6_for_pod(sidecar_pod(env=env), addresses) is ipv6


def test_dual_stack_env_of_a_native_sidecar_counts() -> None:
    manifest = sidecar_pod(env={"ISTIO_DUAL_STACK": "true"}, native=True)
    assert ipv6_for_pod(manifest, DUAL) is True


def test_dual_stack_env_of_another_container_is_ignored() -> None:
    manifest = sidecar_pod()
    manifest["spec"]["containers"][0]["env"] = [{"name": "ISTIO_DUAL_STACK", "value": "true"}]
    assert ipv6_for_pod(manifest, DUAL) is False


def test_pod_ips_from_status() -> None:
    assert pod_ips(sidecar_pod(pod_ips=["10.0.0.1", "fd00::1"])) == ["10.0.0.1", "fd00::1"]
    legacy = sidecar_pod()
    legacy["status"] = {"podIP": "10.0.0.9"}
    assert pod_ips(legacy) == ["10.0.0.9"]
    assert pod_ips(sidecar_pod()) == []


def write_pod(tmp_path: Path, manifest: dict[str, Any]) -> str:
    path = tmp_path / "pod.yaml"
    path.write_text(yaml.safe_dump(manifest))
    return str(path)


@pytest.mark.parametrize(
    ("ips", "env", "families"),
    [
        (["10.244.0.5"], {}, 1),
        (["fd00::5"], {}, 2),
        (["10.244.0.5", "fd00::5"], {}, 1),
        (["10.244.0.5", "fd00::5"], {"ISTIO_DUAL_STACK": "false"}, 1),
        (["10.244.0.5", "fd00::5"], {"ISTIO_DUAL_STACK": "true"}, 2),
    ],
    ids=["v4", "v6", "dual-unset", "dual-false", "dual-true"],
)
def test_cli_pod_ipv6_from_pod_ips_and_dual_stack(
    tmp_path: Path, ips: list[str], env: dict[str, str], families: int
) -> None:
    got = run_rules(["--pod", write_pod(tmp_path, sidecar_pod(env=env, pod_ips=ips))])
    assert got.code == 0, got.stderr
    assert got.stdout.count("* nat\n") == families


def test_cli_pod_explicit_ipv6_wins(tmp_path: Path) -> None:
    path = write_pod(tmp_path, sidecar_pod(pod_ips=["10.244.0.5"]))
    assert run_rules(["--pod", path, "--ipv6=true"]).stdout.count("* nat\n") == 2


def test_cli_pod_ignores_the_callers_dual_stack_env(tmp_path: Path) -> None:
    path = write_pod(tmp_path, sidecar_pod(pod_ips=["10.244.0.5", "fd00::5"]))
    got = run_rules(["--pod", path], env={"ISTIO_DUAL_STACK": "true"})
    assert got.code == 0 and got.stdout.count("* nat\n") == 1


# --- which pods are redirected (plugin.go doAddRun) --------------------------------------------


def _with_containers(containers: list[dict[str, Any]], init: list[dict[str, Any]]) -> Any:
    manifest = sidecar_pod()
    manifest["spec"] = {"containers": containers, "initContainers": init}
    return manifest


@pytest.mark.parametrize(
    ("manifest", "redirect"),
    [
        (sidecar_pod(), True),
        (sidecar_pod(native=True), True),
        (_with_containers([{"name": "app"}], []), False),
        (
            _with_containers([{"name": "app"}], [{"name": "istio-init"}, {"name": "istio-proxy"}]),
            False,
        ),
        (_with_containers([{"name": "istio-proxy"}, {"name": "istio-init"}], []), False),
        (sidecar_pod(proxy={"args": ["proxy", "router"]}), False),
        (sidecar_pod(proxy={"args": ["proxy", "waypoint"]}), False),
        (sidecar_pod(native=True, proxy={"args": ["proxy", "router"]}), False),
        (sidecar_pod(proxy={"args": ["proxy", ""]}), True),
        (sidecar_pod(proxy={"args": ["proxy"]}), True),
        (sidecar_pod(proxy={"args": ["router", "proxy"]}), True),
        (sidecar_pod(proxy={"args": [], "command": ["pilot-agent", "proxy", "router"]}), True),
    ],
    ids=[
        "sidecar",
        "native-sidecar",
        "no-istio-proxy",
        "istio-init-as-init",
        "istio-init-as-container",
        "router",
        "waypoint",
        "native-router",
        "empty-type",
        "proxy-without-type",
        "args-not-proxy-first",
        "command-not-read",
    ],
)
def test_containers_and_proxy_type(manifest: dict[str, Any], redirect: bool) -> None:
    assert decide(manifest, exclude_namespaces=()).redirect is redirect


@pytest.mark.parametrize(
    ("value", "redirect"),
    [
        ("1", False),
        ("t", False),
        ("T", False),
        ("TRUE", False),
        ("true", False),
        ("True", False),
        ("0", True),
        ("f", True),
        ("false", True),
        ("yes", True),
        ("on", True),
        ("", True),
        ("tRuE", True),
    ],
)
def test_disable_envoy_parse_bool(value: str, redirect: bool) -> None:
    manifest = sidecar_pod(env={"DISABLE_ENVOY": value})
    assert decide(manifest, exclude_namespaces=()).redirect is redirect


def test_disable_envoy_on_another_container_is_ignored() -> None:
    manifest = sidecar_pod()
    manifest["spec"]["containers"][0]["env"] = [{"name": "DISABLE_ENVOY", "value": "true"}]
    assert decide(manifest, exclude_namespaces=()).redirect is True


@pytest.mark.parametrize(
    ("labels", "annotations", "redirect"),
    [
        ({}, {}, True),
        ({}, {"sidecar.istio.io/inject": "false"}, False),
        ({}, {"sidecar.istio.io/inject": "0"}, False),
        ({}, {"sidecar.istio.io/inject": "F"}, False),
        ({}, {"sidecar.istio.io/inject": "FALSE"}, False),
        ({}, {"sidecar.istio.io/inject": "no"}, True),  # ParseBool fails: not a "disabled"
        ({}, {"sidecar.istio.io/inject": "true"}, True),
        ({"sidecar.istio.io/inject": "false"}, {"sidecar.istio.io/inject": "true"}, False),
        ({"sidecar.istio.io/inject": "true"}, {"sidecar.istio.io/inject": "false"}, True),
        ({"sidecar.istio.io/inject": ""}, {"sidecar.istio.io/inject": "false"}, True),
        ({"sidecar.istio.io/inject": "nope"}, {"sidecar.istio.io/inject": "false"}, True),
        ({"sidecar.istio.io/inject": "f"}, {}, False),
    ],
    ids=[
        "none",
        "ann-false",
        "ann-0",
        "ann-F",
        "ann-FALSE",
        "ann-unparsable",
        "ann-true",
        "label-false-wins",
        "label-true-wins",
        "empty-label-wins",
        "unparsable-label-wins",
        "label-f",
    ],
)
def test_inject_label_over_annotation(
    labels: dict[str, str], annotations: dict[str, str], redirect: bool
) -> None:
    manifest = sidecar_pod(labels=labels, annotations=annotations)
    assert decide(manifest, exclude_namespaces=()).redirect is redirect


def test_status_annotation_presence_is_required_not_its_value() -> None:
    manifest = sidecar_pod()
    manifest["metadata"]["annotations"] = {}
    assert decide(manifest, exclude_namespaces=()).redirect is False
    manifest["metadata"]["annotations"] = {"sidecar.istio.io/status": ""}
    assert decide(manifest, exclude_namespaces=()).redirect is True
    manifest["metadata"]["annotations"] = {}
    manifest["metadata"]["labels"] = {"sidecar.istio.io/status": "{}"}
    assert decide(manifest, exclude_namespaces=()).redirect is False


def test_exclude_namespaces() -> None:
    manifest = sidecar_pod()
    assert decide(manifest, exclude_namespaces=("app",)).redirect is False
    assert decide(manifest, exclude_namespaces=("kube-system",)).redirect is True


# --- NewRedirect: annotations with their defaults and Istio's checks ---------------------------

INTERCEPTION = "sidecar.istio.io/interceptionMode"
INC_RANGES = "traffic.sidecar.istio.io/includeOutboundIPRanges"
EXC_RANGES = "traffic.sidecar.istio.io/excludeOutboundIPRanges"
INC_IN = "traffic.sidecar.istio.io/includeInboundPorts"
EXC_IN = "traffic.sidecar.istio.io/excludeInboundPorts"
INC_OUT = "traffic.sidecar.istio.io/includeOutboundPorts"
EXC_OUT = "traffic.sidecar.istio.io/excludeOutboundPorts"
EXC_NIC = "traffic.sidecar.istio.io/excludeInterfaces"
KUBEVIRT = "traffic.sidecar.istio.io/kubevirtInterfaces"
REROUTE = "istio.io/reroute-virtual-interfaces"


def test_defaults_of_every_annotation() -> None:
    got = config(sidecar_pod())
    assert got.interception_mode == "REDIRECT"
    assert got.outbound_ip_ranges_include == "*"
    assert got.outbound_ip_ranges_exclude == ()
    assert got.inbound_ports_include == "*"
    assert got.inbound_ports_exclude == ("15020", "15021", "15090")
    assert got.outbound_ports_exclude == ("15020",)
    assert got.outbound_ports_include == ()
    assert got.exclude_interfaces == () and got.reroute_virtual_interfaces == ()
    assert got.proxy_port == "15001"
    assert (got.redirect_dns, got.drop_invalid, got.enable_ipv6) == (False, False, False)


@pytest.mark.parametrize(
    ("key", "value", "field", "expected"),
    [
        (INTERCEPTION, "TPROXY", "interception_mode", "TPROXY"),
        (INTERCEPTION, "REDIRECT", "interception_mode", "REDIRECT"),
        (INC_RANGES, "*", "outbound_ip_ranges_include", "*"),
        (INC_RANGES, "", "outbound_ip_ranges_include", ()),
        (
            INC_RANGES,
            "10.0.0.0/8,fd00::/8",
            "outbound_ip_ranges_include",
            ("10.0.0.0/8", "fd00::/8"),
        ),
        (INC_RANGES, "10.1.2.3/8", "outbound_ip_ranges_include", ("10.1.2.3/8",)),
        (EXC_RANGES, "", "outbound_ip_ranges_exclude", ()),
        (EXC_RANGES, "192.168.0.0/16", "outbound_ip_ranges_exclude", ("192.168.0.0/16",)),
        (INC_IN, "", "inbound_ports_include", ()),
        (INC_IN, "80, 443", "inbound_ports_include", ("80", "443")),
        (INC_IN, " 80 ", "inbound_ports_include", ("80",)),
        (INC_IN, "1,65535", "inbound_ports_include", ("1", "65535")),
        (EXC_IN, "", "inbound_ports_exclude", ("15020", "15021", "15090")),
        (EXC_IN, "   ", "inbound_ports_exclude", ("15020", "15021", "15090")),
        (EXC_IN, "15090, 8080", "inbound_ports_exclude", ("15090", "8080", "15020", "15021")),
        (EXC_OUT, "", "outbound_ports_exclude", ()),
        (EXC_OUT, "5432", "outbound_ports_exclude", ("5432",)),
        (INC_OUT, "3306,5432", "outbound_ports_include", ("3306", "5432")),
        (EXC_NIC, "eth1, net1", "exclude_interfaces", ("eth1", "net1")),
        (EXC_NIC, "", "exclude_interfaces", ()),
        (KUBEVIRT, "k6t-eth0", "reroute_virtual_interfaces", ("k6t-eth0",)),
        (REROUTE, "tap0,v.1_a", "reroute_virtual_interfaces", ("tap0", "v.1_a")),
    ],
)
def test_annotation_accepted(key: str, value: str, field: str, expected: object) -> None:
    got = config(sidecar_pod(annotations={key: value}))
    assert getattr(got, field) == expected


@pytest.mark.parametrize(
    ("key", "value"),
    [
        (INTERCEPTION, ""),
        (INTERCEPTION, "NONE"),
        (INTERCEPTION, "tproxy"),
        (INC_RANGES, " *"),
        (INC_RANGES, "10.0.0.0/8, 192.168.0.0/16"),  # Istio does not trim CIDR items
        (INC_RANGES, "10.0.0.0/8,"),
        (INC_RANGES, "10.0.0.1"),
        (INC_RANGES, "10.0.0.0/08"),
        (INC_RANGES, "10.0.0.0/255.0.0.0"),
        (INC_RANGES, "010.0.0.0/8"),
        (INC_RANGES, "fe80::1%eth0/64"),
        (INC_RANGES, "10.0.0.0/33"),
        (INC_RANGES, "fd00::/129"),
        (EXC_RANGES, "*"),
        (EXC_RANGES, " 10.0.0.0/8"),
        (INC_IN, "80,,443"),
        (INC_IN, "80,"),
        (INC_IN, " *"),
        (INC_IN, "80,*"),
        (INC_IN, "65536"),
        (INC_IN, "0,65535"),  # Istio takes port 0; a pod's port is 1-65535 here
        (INC_IN, "080"),  # Istio writes `--dport 080`; canonical decimal here
        (INC_IN, "+80"),
        (INC_IN, "http"),
        (INC_IN, "  "),  # passes Istio's check, then `--dport` without a port fails
        (EXC_IN, "*"),  # passes Istio's check, then `--dport *` fails in iptables
        (EXC_IN, "80,,90"),
        (EXC_IN, "8080,"),  # checked before Istio appends its ports
        (EXC_OUT, "*"),
        (EXC_OUT, " "),
        (INC_OUT, "*"),
        (INC_OUT, "-1"),
        (EXC_NIC, "eth0,"),
        (EXC_NIC, " "),
        (EXC_NIC, "0eth"),
        (EXC_NIC, "eth@0"),
        (EXC_NIC, "a-very-long-interface"),
        (KUBEVIRT, "net/1"),
        (REROUTE, "tap 0"),
    ],
)
def test_annotation_refused_names_annotation_and_value(key: str, value: str) -> None:
    with pytest.raises(InvalidAnnotationError) as err:
        config(sidecar_pod(annotations={key: value}))
    assert key in str(err.value) and repr(value) in str(err.value)


def test_reroute_annotation_wins_and_kubevirt_is_then_not_checked() -> None:
    got = config(sidecar_pod(annotations={REROUTE: "tap0", KUBEVIRT: "bad/name"}))
    assert got.reroute_virtual_interfaces == ("tap0",)
    got = config(sidecar_pod(annotations={REROUTE: "", KUBEVIRT: "k6t-eth0"}))
    assert got.reroute_virtual_interfaces == ()


@pytest.mark.parametrize(
    "annotations",
    [
        {"status.sidecar.istio.io/port": "not-a-port"},  # registered, never read by NewRedirect
        {"proxy.istio.io/config": "proxyMetadata: [unclosed"},
        {"sidecar.istio.io/inject": "maybe"},
        {"traffic.sidecar.istio.io/includeOutboundIPranges": "bad"},  # not the key: case matters
    ],
    ids=["status-port", "proxy-config", "inject", "misspelled-key"],
)
def test_annotations_istio_does_not_read_never_fail(annotations: dict[str, str]) -> None:
    assert config(sidecar_pod(annotations=annotations)) == config(sidecar_pod())


# --- the proxy container: securityContext and env ----------------------------------------------


@pytest.mark.parametrize(
    ("security", "uid", "gid"),
    [
        ({}, "1337", "1337"),
        ({"runAsUser": 0, "runAsGroup": 0}, "1337", "1337"),
        ({"runAsUser": 1500}, "1500", "1337"),
        ({"runAsGroup": 2000}, "1337", "2000"),
        ({"runAsUser": 1500, "runAsGroup": 2000}, "1500", "2000"),
    ],
)
def test_proxy_ids_from_the_container_security_context(
    security: dict[str, int], uid: str, gid: str
) -> None:
    got = config(sidecar_pod(proxy={"securityContext": security}))
    assert got.proxy_uids == (uid,) and got.proxy_gids == (gid,)


def test_pod_security_context_is_not_read() -> None:
    manifest = sidecar_pod()
    manifest["spec"]["securityContext"] = {"runAsUser": 1500, "runAsGroup": 2000}
    got = config(manifest)
    assert got.proxy_uids == ("1337",) and got.proxy_gids == ("1337",)


def test_native_sidecar_security_context_counts() -> None:
    got = config(sidecar_pod(native=True, proxy={"securityContext": {"runAsUser": 1500}}))
    assert got.proxy_uids == ("1500",)


@pytest.mark.parametrize(
    ("name", "value", "field", "expected"),
    [
        ("ISTIO_META_DNS_CAPTURE", "true", "redirect_dns", True),
        ("ISTIO_META_DNS_CAPTURE", "1", "capture_all_dns", True),
        ("ISTIO_META_DNS_CAPTURE", "yes", "redirect_dns", False),
        ("ISTIO_META_DNS_CAPTURE", "false", "redirect_dns", False),
        ("INVALID_DROP", "true", "drop_invalid", True),
        ("INVALID_DROP", "T", "drop_invalid", True),
        ("INVALID_DROP", "on", "drop_invalid", False),
        ("ISTIO_META_ENABLE_HBONE", "true", "redirect_dns", False),  # not read by the plugin
    ],
)
def test_proxy_env(name: str, value: str, field: str, expected: bool) -> None:
    assert getattr(config(sidecar_pod(env={name: value})), field) is expected


def test_env_from_value_from_reads_as_empty() -> None:
    manifest = sidecar_pod(
        proxy={"env": [{"name": "INVALID_DROP", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}]}
    )
    assert config(manifest).drop_invalid is False


def test_dns_capture_ignores_the_resolvers() -> None:
    got = capture_config_for_pod(
        sidecar_pod(env={"ISTIO_META_DNS_CAPTURE": "true"}),
        ipv6=True,
        dns_servers=["10.96.0.10", "fd00::10"],
    )
    assert got.capture_all_dns is True
    assert (got.dns_servers_v4, got.dns_servers_v6) == ((), ())
