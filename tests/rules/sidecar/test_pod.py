"""Which pods Istio's plugin programs, and how annotations and the proxy container shape rules."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from agent.errors import InvalidAnnotationError
from agent.rules.sidecar.pod import capture_config_for_pod, decide
from tests.rules.conftest import run_rules

EXCLUDED = ("istio-system", "kube-system")


def pod(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "p",
            "namespace": "app",
            "annotations": {"sidecar.istio.io/status": "{}"},
        },
        "spec": {"containers": [{"name": "app"}, {"name": "istio-proxy"}]},
    }
    out = copy.deepcopy(base)
    for path, value in overrides.items():
        node = out
        keys = path.split("__")
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        node[keys[-1]] = value
    return out


@pytest.mark.parametrize(
    ("manifest", "redirect", "reason"),
    [
        (pod(), True, "injected"),
        (pod(metadata__namespace="kube-system"), False, "namespace kube-system is excluded"),
        (pod(spec__hostNetwork=True), False, "host network"),
        (pod(spec__containers=[{"name": "app"}]), False, "no istio-proxy"),
        (pod(spec__initContainers=[{"name": "istio-init"}]), False, "istio-init"),
        (pod(metadata__annotations={}), False, "sidecar.istio.io/status"),
        (
            pod(
                metadata__annotations={
                    "sidecar.istio.io/status": "{}",
                    "sidecar.istio.io/inject": "false",
                }
            ),
            False,
            "disabled",
        ),
        (
            pod(
                metadata__labels={"sidecar.istio.io/inject": "false"},
                metadata__annotations={
                    "sidecar.istio.io/status": "{}",
                    "sidecar.istio.io/inject": "true",
                },
            ),
            False,
            "disabled",
        ),
        (
            pod(
                metadata__labels={"sidecar.istio.io/inject": "true"},
                metadata__annotations={
                    "sidecar.istio.io/status": "{}",
                    "sidecar.istio.io/inject": "false",
                },
            ),
            True,
            "injected",
        ),
        (
            pod(spec__containers=[{"name": "istio-proxy", "args": ["proxy", "router"]}]),
            False,
            "router",
        ),
        (
            pod(
                spec__containers=[
                    {"name": "istio-proxy", "env": [{"name": "DISABLE_ENVOY", "value": "true"}]}
                ]
            ),
            False,
            "DISABLE_ENVOY",
        ),
        (
            pod(
                spec__containers=[{"name": "app"}],
                spec__initContainers=[{"name": "istio-proxy", "restartPolicy": "Always"}],
            ),
            True,
            "injected",
        ),
    ],
    ids=[
        "injected",
        "excluded-ns",
        "host-network",
        "no-proxy",
        "istio-init",
        "no-status",
        "inject-annotation-false",
        "label-wins-false",
        "label-wins-true",
        "gateway",
        "disable-envoy",
        "native-sidecar",
    ],
)
def test_decide(manifest: dict[str, Any], redirect: bool, reason: str) -> None:
    got = decide(manifest, exclude_namespaces=EXCLUDED)
    assert got.redirect is redirect
    assert reason in got.reason


def test_defaults_match_istio_plugin() -> None:
    got = capture_config_for_pod(pod(), ipv6=False, dns_servers=[])
    assert got.inbound_ports_include == "*"
    assert got.inbound_ports_exclude == ("15020", "15021", "15090")
    assert got.outbound_ports_exclude == ("15020",)
    assert got.outbound_ip_ranges_include == "*"
    assert got.proxy_uids == ("1337",) and got.proxy_gids == ("1337",)
    assert got.redirect_dns is False and got.drop_invalid is False


def test_exclude_inbound_ports_always_keeps_proxy_ports() -> None:
    manifest = pod(
        metadata__annotations={
            "sidecar.istio.io/status": "{}",
            "traffic.sidecar.istio.io/excludeInboundPorts": "8080, 15021",
        }
    )
    got = capture_config_for_pod(manifest, ipv6=False, dns_servers=[])
    # Istio drops repeats as written: " 15021" is not "15021", so it excludes 15021 twice.
    assert got.inbound_ports_exclude == ("8080", "15021", "15020", "15021", "15090")


def test_repeated_ports_make_repeated_rules_as_in_istio() -> None:
    manifest = pod(
        metadata__annotations={
            "sidecar.istio.io/status": "{}",
            "traffic.sidecar.istio.io/excludeInboundPorts": "9000,9000,15020",
            "traffic.sidecar.istio.io/includeInboundPorts": "8080,8080",
            "traffic.sidecar.istio.io/includeOutboundPorts": "3306, 3306",
        }
    )
    got = capture_config_for_pod(manifest, ipv6=False, dns_servers=[])
    assert got.inbound_ports_exclude == ("9000", "15020", "15021", "15090")
    assert got.inbound_ports_include == ("8080", "8080")
    assert got.outbound_ports_include == ("3306", "3306")


def test_uid_zero_means_default_and_group_is_independent() -> None:
    manifest = pod(
        spec__containers=[
            {"name": "istio-proxy", "securityContext": {"runAsUser": 0, "runAsGroup": 2000}}
        ]
    )
    got = capture_config_for_pod(manifest, ipv6=False, dns_servers=[])
    assert got.proxy_uids == ("1337",) and got.proxy_gids == ("2000",)


def test_dns_capture_from_proxy_env_only_not_proxy_config() -> None:
    """Istio's plugin reads ISTIO_META_DNS_CAPTURE from the proxy's env; proxy.istio.io/config
    is the injector's input, never the plugin's."""
    manifest = pod(
        metadata__annotations={
            "sidecar.istio.io/status": "{}",
            "proxy.istio.io/config": "proxyMetadata:\n  ISTIO_META_DNS_CAPTURE: 'true'\n",
        },
        spec__containers=[
            {"name": "istio-proxy", "env": [{"name": "ISTIO_META_DNS_CAPTURE", "value": "false"}]}
        ],
    )
    assert capture_config_for_pod(manifest, ipv6=False, dns_servers=[]).redirect_dns is False
    manifest["spec"]["containers"][0]["env"] = []
    assert capture_config_for_pod(manifest, ipv6=False, dns_servers=[]).redirect_dns is False
    manifest["spec"]["containers"][0]["env"] = [{"name": "ISTIO_META_DNS_CAPTURE", "value": "T"}]
    got = capture_config_for_pod(manifest, ipv6=False, dns_servers=["10.96.0.10"])
    assert got.redirect_dns is True and got.capture_all_dns is True
    assert got.dns_servers_v4 == () and got.dns_servers_v6 == ()


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("sidecar.istio.io/interceptionMode", "NONE"),
        ("sidecar.istio.io/interceptionMode", "redirect"),
        ("traffic.sidecar.istio.io/includeOutboundIPRanges", "10.0.0.0/33"),
        ("traffic.sidecar.istio.io/includeOutboundIPRanges", "10.0.0.1"),
        ("traffic.sidecar.istio.io/excludeOutboundIPRanges", "*"),
        ("traffic.sidecar.istio.io/includeInboundPorts", "80,99999"),
        ("traffic.sidecar.istio.io/excludeInboundPorts", "http"),
        ("traffic.sidecar.istio.io/excludeOutboundPorts", "*"),
        ("traffic.sidecar.istio.io/includeOutboundPorts", "-1"),
        ("traffic.sidecar.istio.io/excludeInterfaces", "eth0/1"),
        ("traffic.sidecar.istio.io/kubevirtInterfaces", "a-very-long-interface-name"),
    ],
)
def test_invalid_annotation_names_annotation_and_value(key: str, value: str) -> None:
    manifest = pod(metadata__annotations={"sidecar.istio.io/status": "{}", key: value})
    with pytest.raises(InvalidAnnotationError) as err:
        capture_config_for_pod(manifest, ipv6=False, dns_servers=[])
    assert key in str(err.value) and value in str(err.value)


def test_cli_skips_with_reason_and_fails_on_bad_annotation(tmp_path: Path) -> None:
    skipped = tmp_path / "skipped.yaml"
    skipped.write_text(
        "kind: Pod\nmetadata: {name: x, namespace: kube-system}\n"
        "spec: {containers: [{name: istio-proxy}]}\n"
    )
    got = run_rules(["--pod", str(skipped), "--ipv6=false"])
    assert (got.code, got.stdout) == (0, "")
    assert "kube-system" in got.stderr

    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "kind: Pod\nmetadata:\n  name: x\n  namespace: app\n  annotations:\n"
        "    sidecar.istio.io/status: '{}'\n"
        "    traffic.sidecar.istio.io/includeOutboundIPRanges: 300.0.0.0/8\n"
        "spec: {containers: [{name: istio-proxy}]}\n"
    )
    got = run_rules(["--pod", str(bad), "--ipv6=false"])
    assert got.code != 0 and got.stdout == ""
    assert "traffic.sidecar.istio.io/includeOutboundIPRanges" in got.stderr
    assert "300.0.0.0/8" in got.stderr


def test_cli_pod_uses_exclude_namespaces_from_config(tmp_path: Path) -> None:
    conf = tmp_path / "config.yaml"
    conf.write_text("excludeNamespaces: [app]\n")
    manifest = tmp_path / "pod.json"
    manifest.write_text(
        '{"kind": "Pod", "metadata": {"name": "p", "namespace": "app", '
        '"annotations": {"sidecar.istio.io/status": "{}"}}, '
        '"spec": {"containers": [{"name": "istio-proxy"}]}}'
    )
    got = run_rules(["--pod", str(manifest), "--ipv6=false", "--config", str(conf)])
    assert (got.code, got.stdout) == (0, "")
    assert "namespace app is excluded" in got.stderr
    assert run_rules(["--pod", str(manifest), "--ipv6=false"]).stdout.startswith("* nat")


def test_cli_pod_refuses_istio_flags(tmp_path: Path) -> None:
    got = run_rules(["--pod", "x.yaml", "--envoy-port=1", "--ipv6=false"])
    assert got.code == 2 and "--envoy-port" in got.stderr
