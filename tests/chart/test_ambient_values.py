"""The chart's `ambient.*` values: Istio's names, meanings and defaults, rendered into config.yaml's
`ambient:` section and loaded by the agent's own loader; the ztunnel socket mount and the RBAC
ambient needs exist only when ambient is on; bad values fail naming the key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.config import AmbientSettings, Settings, settings_from_mapping
from agent.label_selectors import DEFAULT_ENABLEMENT_SELECTORS
from testbed.helm import CHART, Helm
from tests.chart.conftest import PLATFORMS, agent_config, host_paths, mounts, only, platform_values
from tests.chart.test_bad_values import names_value
from tests.chart.test_docs import helm4, notes  # noqa: F401  (fixture)
from tests.chart.test_rbac import grants
from tests.chart.test_render_valid import VALIDATE

pytestmark = pytest.mark.chart

AMBIENT_GRANTS = {
    ("", "namespaces", "get"),
    ("", "namespaces", "list"),
    ("", "namespaces", "watch"),
    ("", "pods/status", "patch"),
}


def loaded(docs: list[dict[str, Any]]) -> Settings:
    """config.yaml as the agent loads it (unknown keys or wrong types would raise here)."""
    return settings_from_mapping(agent_config(docs), source="rendered config.yaml")


def role_grants(docs: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return grants(only(docs, "ClusterRole")["rules"])


def test_defaults_are_istios_and_ambient_is_off(helm: Helm) -> None:
    docs = helm.render()
    ambient = loaded(docs).ambient
    assert ambient == AmbientSettings()
    assert ambient.enabled is False
    assert ambient.enablementSelectors == DEFAULT_ENABLEMENT_SELECTORS
    # Every AmbientSettings field is rendered, nothing else.
    assert set(agent_config(docs)["ambient"]) == set(AmbientSettings.__dataclass_fields__)
    assert "ztunnel-socket-dir" not in host_paths(docs)
    assert "/var/run/ztunnel" not in mounts(docs)
    assert not role_grants(docs) & AMBIENT_GRANTS


ENABLE = {
    "values": ["ambient.enabled=true"],
    "cni-prefix": ["cni.ambient.enabled=true"],
    "profile": ["profile=ambient"],
    "global-profile": ["global.profile=ambient"],
    "env": ["env.AMBIENT_ENABLED=true"],
}


@pytest.mark.parametrize("sets", ENABLE.values(), ids=ENABLE.keys())
def test_each_way_of_turning_ambient_on(helm: Helm, sets: list[str]) -> None:
    docs = helm.render(sets=sets, namespace="istio-system")
    assert loaded(docs).ambient.enabled is True
    assert host_paths(docs)["ztunnel-socket-dir"] == "/var/run/ztunnel"
    mount = mounts(docs)["/var/run/ztunnel"]
    assert mount["name"] == "ztunnel-socket-dir" and not mount.get("readOnly")
    assert role_grants(docs) >= AMBIENT_GRANTS


def test_the_netns_dir_is_mounted_with_host_to_container_propagation(helm: Helm) -> None:
    # Istio adds this mount only for ambient; ours always has it (repair needs it too), once.
    for sets in ([], ["ambient.enabled=true"]):
        docs = helm.render(sets=sets)
        m = mounts(docs)
        for path in ("/var/run/netns", "/host/var/run/netns"):
            assert m[path]["mountPropagation"] == "HostToContainer", (sets, path)
        netns = [
            v
            for v in only(docs, "DaemonSet")["spec"]["template"]["spec"]["volumes"]
            if v["name"] == "cni-netns-dir"
        ]
        assert len(netns) == 1


EACH_VALUE: dict[str, tuple[list[str], dict[str, Any]]] = {
    "dns-capture": (["ambient.dnsCapture=false"], {"dnsCapture": False}),
    "ipv6": (["ambient.ipv6=false"], {"ipv6": False}),
    "reconcile": (
        ["ambient.reconcileIptablesOnStartup=false"],
        {"reconcileIptablesOnStartup": False},
    ),
    "detection-retry": (
        ["ambient.enableAmbientDetectionRetry=true"],
        {"enableAmbientDetectionRetry": True},
    ),
    "socket": (
        ["ambient.ztunnelSocketPath=/run/zt/zds.sock"],
        {"ztunnelSocketPath": "/run/zt/zds.sock"},
    ),
    "system-namespace": (["ambient.systemNamespace=mesh"], {"systemNamespace": "mesh"}),
    "snat": (["ambient.hostProbeSnatAddress=169.254.7.1"], {"hostProbeSnatAddress": "169.254.7.1"}),
    "snat-v6": (["ambient.hostProbeSnatAddressV6=fd00::7"], {"hostProbeSnatAddressV6": "fd00::7"}),
    "cni-prefix": (
        ["cni.ambient.dnsCapture=false", "cni.ambient.ipv6=false"],
        {"dnsCapture": False, "ipv6": False},
    ),
    "env-dns": (["env.AMBIENT_DNS_CAPTURE=false"], {"dnsCapture": False}),
    "env-ipv6": (["env.AMBIENT_IPV6=0"], {"ipv6": False}),
    "env-reconcile": (
        ["env.AMBIENT_RECONCILE_POD_RULES_ON_STARTUP=false"],
        {"reconcileIptablesOnStartup": False},
    ),
    "env-retry": (
        ["env.ENABLE_AMBIENT_DETECTION_RETRY=true"],
        {"enableAmbientDetectionRetry": True},
    ),
    "env-socket": (
        ["env.ZTUNNEL_UDS_ADDRESS=/run/zt/zds.sock"],
        {"ztunnelSocketPath": "/run/zt/zds.sock"},
    ),
    "env-system-namespace": (["env.SYSTEM_NAMESPACE=mesh"], {"systemNamespace": "mesh"}),
    "env-snat": (["env.HOST_PROBE_SNAT_IP=169.254.7.1"], {"hostProbeSnatAddress": "169.254.7.1"}),
    "env-snat-v6": (["env.HOST_PROBE_SNAT_IPV6=fd00::7"], {"hostProbeSnatAddressV6": "fd00::7"}),
    "compat-1.25": (["compatibilityVersion=1.25"], {"reconcileIptablesOnStartup": False}),
    "compat-1.25-overridden": (
        ["compatibilityVersion=1.25", "cni.ambient.reconcileIptablesOnStartup=true"],
        {"reconcileIptablesOnStartup": True},
    ),
    # A value equal to its default counts as not given: the profile's wins over it.
    "compat-1.25-over-a-default": (
        ["compatibilityVersion=1.25", "ambient.reconcileIptablesOnStartup=true"],
        {"reconcileIptablesOnStartup": False},
    ),
    "profile-overridden": (["profile=ambient", "cni.ambient.enabled=false"], {"enabled": False}),
    # As Istio's chart: its profile's cni.ambient.enabled wins over an unprefixed false.
    "profile-over-a-default": (["profile=ambient", "ambient.enabled=false"], {"enabled": True}),
}


@pytest.mark.parametrize(("sets", "expected"), EACH_VALUE.values(), ids=EACH_VALUE.keys())
def test_each_value_reaches_the_agent(
    helm: Helm, sets: list[str], expected: dict[str, Any]
) -> None:
    ambient = loaded(
        helm.render(sets=[*sets, "ambient.enabled=true"] if "enabled" not in expected else sets)
    ).ambient
    want = AmbientSettings(**{"enabled": True, **expected})
    assert ambient == want


def test_socket_dir_mount_follows_the_socket_path(helm: Helm) -> None:
    docs = helm.render(sets=["ambient.enabled=true", "ambient.ztunnelSocketPath=/run/zt/zds.sock"])
    assert host_paths(docs)["ztunnel-socket-dir"] == "/run/zt"
    assert mounts(docs)["/run/zt"]["name"] == "ztunnel-socket-dir"


CUSTOM_SELECTORS = """\
ambient:
  enabled: true
  enablementSelectors:
    - podSelector:
        matchLabels: {example.com/mesh: ambient}
      namespaceSelector:
        matchExpressions:
          - {key: tier, operator: In, values: [web, api]}
          - {key: legacy, operator: DoesNotExist}
"""


def test_custom_enablement_selectors(helm: Helm, tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(CUSTOM_SELECTORS)
    (selector,) = loaded(helm.render(values=[values])).ambient.enablementSelectors
    assert selector.to_dict() == {
        "podSelector": {"matchLabels": {"example.com/mesh": "ambient"}},
        "namespaceSelector": {
            "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["web", "api"]},
                {"key": "legacy", "operator": "DoesNotExist"},
            ]
        },
    }


def test_empty_enablement_selectors_enroll_nothing(helm: Helm, tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text("ambient: {enabled: true, enablementSelectors: []}\n")
    assert loaded(helm.render(values=[values])).ambient.enablementSelectors == ()


def test_enablement_selector_env_is_istios_yaml_text(helm: Helm, tmp_path: Path) -> None:
    # Istio's ConfigMap carries AMBIENT_ENABLEMENT_SELECTOR as the YAML text of the list.
    text = yaml.safe_dump([{"podSelector": {"matchLabels": {"mesh": "yes"}}}])
    values = tmp_path / "values.yaml"
    values.write_text(
        yaml.safe_dump({"env": {"AMBIENT_ENABLED": "true", "AMBIENT_ENABLEMENT_SELECTOR": text}})
    )
    (selector,) = loaded(helm.render(values=[values])).ambient.enablementSelectors
    assert selector.to_dict() == {
        "podSelector": {"matchLabels": {"mesh": "yes"}},
        "namespaceSelector": {},
    }


@pytest.mark.parametrize(
    ("sets", "first", "second"),
    [
        (
            ["ambient.dnsCapture=false", "env.AMBIENT_DNS_CAPTURE=true"],
            "ambient.dnsCapture",
            "env.AMBIENT_DNS_CAPTURE",
        ),
        (
            ["ambient.enabled=true", "env.AMBIENT_ENABLED=false"],
            "ambient.enabled",
            "env.AMBIENT_ENABLED",
        ),
        (["ambient.ipv6=false", "cni.ambient.ipv6=true"], "ambient.ipv6", "cni.ambient.ipv6"),
        (
            ["ambient.ztunnelSocketPath=/a/z.sock", "env.ZTUNNEL_UDS_ADDRESS=/b/z.sock"],
            "ambient.ztunnelSocketPath",
            "env.ZTUNNEL_UDS_ADDRESS",
        ),
    ],
    ids=["env-dns", "env-enabled", "cni-prefix", "env-socket"],
)
def test_a_setting_given_two_ways_fails_naming_both(
    helm: Helm, sets: list[str], first: str, second: str
) -> None:
    proc = helm.template(sets=sets, check=False)
    assert proc.returncode != 0, "accepted"
    assert first in proc.stderr and second in proc.stderr, proc.stderr
    assert "values: " in proc.stderr and "templates/validate-values.yaml" in proc.stderr


@pytest.mark.parametrize(
    ("sets", "expected"),
    [
        (["ambient.dnsCapture=true", "env.AMBIENT_DNS_CAPTURE=false"], {"dnsCapture": False}),
        (["ambient.ipv6=true", "cni.ambient.ipv6=false"], {"ipv6": False}),
    ],
    ids=["env-dns", "cni-prefix"],
)
def test_an_alias_next_to_a_default_is_that_setting(
    helm: Helm, sets: list[str], expected: dict[str, Any]
) -> None:
    # values.yaml holds the defaults: our key at its default counts as not given.
    ambient = loaded(helm.render(sets=[*sets, "ambient.enabled=true"])).ambient
    assert ambient == AmbientSettings(**{"enabled": True, **expected})


BAD_VALUES = [
    pytest.param("ambient.enabled=yes", "ambient.enabled", id="enabled-type"),
    pytest.param("ambient.dnsCapture=on", "ambient.dnsCapture", id="dns-type"),
    pytest.param("ambient.ipv6=1", "ambient.ipv6", id="ipv6-type"),
    pytest.param(
        "ambient.reconcileIptablesOnStartup=no",
        "ambient.reconcileIptablesOnStartup",
        id="reconcile-type",
    ),
    pytest.param(
        "ambient.shareHostNetworkNamespace=maybe",
        "ambient.shareHostNetworkNamespace",
        id="share-type",
    ),
    pytest.param(
        "ambient.enableAmbientDetectionRetry=x",
        "ambient.enableAmbientDetectionRetry",
        id="retry-type",
    ),
    pytest.param(
        "ambient.ztunnelSocketPath=run/z.sock", "ambient.ztunnelSocketPath", id="socket-relative"
    ),
    pytest.param(
        "ambient.ztunnelSocketPath=/var/run/ztunnel/",
        "ambient.ztunnelSocketPath",
        id="socket-is-a-dir",
    ),
    pytest.param(
        "ambient.systemNamespace=Istio_System", "ambient.systemNamespace", id="system-namespace"
    ),
    pytest.param(
        "ambient.hostProbeSnatAddress=169.254.7", "ambient.hostProbeSnatAddress", id="snat"
    ),
    pytest.param(
        "ambient.hostProbeSnatAddressV6=fd::zz", "ambient.hostProbeSnatAddressV6", id="snat-v6"
    ),
    pytest.param("ambient.enableDns=true", "ambient.enableDns", id="unknown-key"),
    pytest.param("cni.ambient.dnsCapture=on", "cni.ambient.dnsCapture", id="cni-prefix"),
    pytest.param(
        "ambient.enablementSelectors[0].podSelektor.matchLabels.a=b",
        "ambient.enablementSelectors.0.podSelektor",
        id="selector-entry-key",
    ),
    pytest.param(
        "ambient.enablementSelectors[0].podSelector.matchLabels.a=-x-",
        "ambient.enablementSelectors.0.podSelector.matchLabels.a",
        id="label-value",
    ),
]


@pytest.mark.parametrize(("setting", "path"), BAD_VALUES)
def test_bad_value_is_rejected_naming_it(helm: Helm, setting: str, path: str) -> None:
    proc = helm.template(sets=[setting], check=False)
    assert proc.returncode != 0, f"{setting} was accepted"
    assert names_value(proc.stderr, path), proc.stderr


BAD_SELECTORS = {
    "operator": ("{key: a, operator: Equals, values: [b]}", "operator"),
    "in-without-values": ("{key: a, operator: In}", "values"),
    "exists-with-values": ("{key: a, operator: Exists, values: [b]}", "values"),
    "bad-key": ("{key: 'a b', operator: Exists}", "key"),
}


@pytest.mark.parametrize(("expression", "leaf"), BAD_SELECTORS.values(), ids=BAD_SELECTORS.keys())
def test_bad_selector_expression_is_rejected_naming_it(
    helm: Helm, tmp_path: Path, expression: str, leaf: str
) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(
        "ambient:\n  enablementSelectors:\n    - podSelector:\n"
        f"        matchExpressions: [{expression}]\n"
    )
    proc = helm.template(values=[values], check=False)
    assert proc.returncode != 0, "accepted"
    where = "enablementSelectors.0.podSelector.matchExpressions.0"
    assert (
        f"ambient.{where}" in proc.stderr or f"/ambient/{where.replace('.', '/')}" in proc.stderr
    ), proc.stderr
    assert leaf in proc.stderr


BAD_ENV = {
    "enabled": ("env.AMBIENT_ENABLED=yes", 'env.AMBIENT_ENABLED: "yes" is not a boolean'),
    "dns": ("env.AMBIENT_DNS_CAPTURE=on", 'env.AMBIENT_DNS_CAPTURE: "on" is not a boolean'),
    "socket": (
        "env.ZTUNNEL_UDS_ADDRESS=z.sock",
        'env.ZTUNNEL_UDS_ADDRESS: "z.sock" is not an absolute path',
    ),
    "namespace": ("env.SYSTEM_NAMESPACE=Mesh", 'env.SYSTEM_NAMESPACE: "Mesh" is not a namespace'),
    "snat": (
        "env.HOST_PROBE_SNAT_IP=300.1.1.1",
        'env.HOST_PROBE_SNAT_IP: "300.1.1.1" is not an IPv4 address',
    ),
    "snat-v6": (
        "env.HOST_PROBE_SNAT_IPV6=10.0.0.1",
        'env.HOST_PROBE_SNAT_IPV6: "10.0.0.1" is not an IPv6 address',
    ),
    "selector-not-list": (
        "env.AMBIENT_ENABLEMENT_SELECTOR=podSelector: {}",
        "env.AMBIENT_ENABLEMENT_SELECTOR: not a YAML list",
    ),
    "selector-entry-key": (
        "env.AMBIENT_ENABLEMENT_SELECTOR=[{podselector: {}}]",
        'env.AMBIENT_ENABLEMENT_SELECTOR: unknown key "podselector"',
    ),
}


@pytest.mark.parametrize(("setting", "message"), BAD_ENV.values(), ids=BAD_ENV.keys())
def test_bad_env_value_is_rejected_naming_it(helm: Helm, setting: str, message: str) -> None:
    proc = helm.template(sets=[setting], check=False)
    assert proc.returncode != 0, f"{setting} was accepted"
    assert message in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    ("sets", "extra"),
    [
        ([], set()),
        (["ambient.enabled=true"], AMBIENT_GRANTS),
        (["ambient.enabled=false", "ambient.dnsCapture=false"], set()),
        (["ambient.enabled=true", "repair.mode=label"], AMBIENT_GRANTS),
        (["ambient.enabled=true", "repair.mode=delete"], AMBIENT_GRANTS | {("", "pods", "delete")}),
    ],
    ids=["off", "on", "off-with-options", "on-with-label-repair", "on-with-delete-repair"],
)
def test_cluster_role_grants_ambient_rights_only_when_on(
    helm: Helm, sets: list[str], extra: set[tuple[str, str, str]]
) -> None:
    role = only(helm.render(sets=sets), "ClusterRole")
    base = {
        ("", "pods", "get"),
        ("", "pods", "list"),
        ("", "pods", "watch"),
        ("", "events", "create"),
        ("", "events", "patch"),
        ("", "nodes", "get"),
    }
    assert grants(role["rules"]) == base | extra
    # pods/status appears in one rule only, whichever feature asked for it.
    assert sum("pods/status" in r["resources"] for r in role["rules"]) == (
        1 if ("", "pods/status", "patch") in extra else 0
    )
    assert not any(r.get("resourceNames") for r in role["rules"])


@pytest.mark.parametrize(
    ("sets", "ignored"),
    [
        (["ambient.enabled=true", "ambient.shareHostNetworkNamespace=true"], False),
        (["ambient.enabled=true", "cni.ambient.shareHostNetworkNamespace=false"], True),
        (["ambient.enabled=true", "ambient.shareHostNetworkNamespace=false"], False),
        (["ambient.enabled=true"], False),
    ],
    ids=["true-is-what-we-do", "false-cannot-be-honoured", "false-is-the-default", "unset"],
)
def test_share_host_network_namespace(
    helm4: Helm,  # noqa: F811
    sets: list[str],
    ignored: bool,
) -> None:
    text = notes(helm4, *sets)
    assert ("  - ambient.shareHostNetworkNamespace\n" in text) is ignored
    docs = helm4.render(sets=sets)
    assert only(docs, "DaemonSet")["spec"]["template"]["spec"]["hostNetwork"] is True
    assert "shareHostNetworkNamespace" not in agent_config(docs)["ambient"]


@pytest.mark.parametrize("sets", ENABLE.values(), ids=ENABLE.keys())
def test_notes_say_ambient_is_on(helm4: Helm, sets: list[str]) -> None:  # noqa: F811
    text = notes(helm4, *sets)
    assert "Ambient mode: on" in text
    assert "/var/run/ztunnel/ztunnel.sock" in text
    assert "WARNING: global.hub" not in text and "ambient" not in text[text.find("Ignored:") :]


def test_notes_point_a_chained_ambient_install_to_its_own_file(helm4: Helm) -> None:  # noqa: F811
    """A primary that rewrites its file at boot drops a chained entry: ambient pods restarted by
    the reboot start unenrolled until the agent runs (tests/node/test_reboot.py measures it)."""
    note = "Set istioOwnedCNIConfig=true to close that window"
    assert note in notes(helm4, "ambient.enabled=true")
    assert note not in notes(helm4, "ambient.enabled=true", "istioOwnedCNIConfig=true")
    assert note not in notes(helm4)  # sidecar only: istio-validation holds such a pod back


def test_notes_say_ambient_is_off_by_default(helm4: Helm) -> None:  # noqa: F811
    text = notes(helm4)
    assert "Ambient mode: off" in text and "Ignored:" not in text


@pytest.mark.parametrize("platform", PLATFORMS)
def test_ambient_on_every_platform_preset(helm: Helm, platform: str) -> None:
    docs = helm.render(values=platform_values(platform), sets=["ambient.enabled=true"])
    settings = loaded(docs)
    assert settings.ambient.enabled is True
    assert host_paths(docs)["ztunnel-socket-dir"] == "/var/run/ztunnel"
    # The preset's netns dir is the one mounted with propagation, as for sidecar pods.
    assert mounts(docs)[host_paths(docs)["cni-netns-dir"]]["mountPropagation"] == "HostToContainer"


def test_ambient_manifests_lint_clean_and_are_valid_kubernetes(helm: Helm, tmp_path: Path) -> None:
    out = helm.run("lint", "--strict", str(CHART), "--set", "ambient.enabled=true")
    assert "0 chart(s) failed" in out and "[WARNING]" not in out, out
    rendered = tmp_path / "manifests.yaml"
    rendered.write_text(helm.template(sets=["profile=ambient"]).stdout)
    proc = subprocess.run(
        [sys.executable, str(VALIDATE), "--kube", "1.29", "--kube", "1.37", str(rendered)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "INVALID" not in proc.stdout and "ClusterRole/istio-cni" in proc.stdout
