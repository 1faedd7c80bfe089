"""Istio's spellings of our values: a setting given twice fails naming both, unknown keys are still
rejected, keys without effect install and are named in NOTES, env maps onto our settings, and the
pod and RBAC changes that make the chart a drop-in for Istio's."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from agent.config import settings_from_mapping
from testbed.helm import CHART, Helm, HelmError
from tests.chart.conftest import agent_config, agent_container, of_kind, only
from tests.chart.test_bad_values import names_value
from tests.chart.test_docs import helm4, notes  # noqa: F401  (fixture)

APP_VERSION = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]

pytestmark = pytest.mark.chart


@pytest.mark.parametrize(
    ("sets", "first", "second"),
    [
        (["logLevel=debug", "logging.level=info"], "logLevel", "logging.level"),
        (["repair.mode=label", "repair.deletePods=true"], "repair.mode", "repair.deletePods"),
        (
            ["resourceQuota.enabled=true", "resourceQuotas.enabled=false"],
            "resourceQuota.enabled",
            "resourceQuotas.enabled",
        ),
        (["cniBinDir=/a", "cni.cniBinDir=/b"], "cniBinDir", "cni.cniBinDir"),
        (
            ["repair.labelKey=a", "repair.brokenPodLabelKey=b"],
            "repair.labelKey",
            "repair.brokenPodLabelKey",
        ),
        (
            ["cniConfFileName=a.conf", "env.CNI_CONF_NAME=b.conf"],
            "cniConfFileName",
            "env.CNI_CONF_NAME",
        ),
        (
            ["repair.deletePods=true", "env.REPAIR_DELETE_PODS=true"],
            "repair.deletePods",
            "env.REPAIR_DELETE_PODS",
        ),
        (
            ["ruleBackend=iptables-nft", "env.NATIVE_NFTABLES=true"],
            "ruleBackend",
            "env.NATIVE_NFTABLES",
        ),
    ],
    ids=[
        "log-level",
        "repair",
        "quota",
        "cni-prefix",
        "label-key",
        "env",
        "env-repair",
        "env-backend",
    ],
)
def test_a_setting_given_two_ways_fails_naming_both(
    helm: Helm, sets: list[str], first: str, second: str
) -> None:
    proc = helm.template(sets=sets, check=False)
    assert proc.returncode != 0, "accepted"
    assert first in proc.stderr and second in proc.stderr, proc.stderr


def test_the_same_value_under_x_and_cni_x_is_accepted(helm: Helm) -> None:
    # Istio's own gke platform profile sets resourceQuotas both ways.
    docs = helm.render(sets=["cniBinDir=/a", "cni.cniBinDir=/a"])
    assert agent_config(docs)["cniBinDir"] == "/a"


@pytest.mark.parametrize(
    ("setting", "path"),
    [
        ("cniBinDIr=/x", "cniBinDIr"),
        ("cni.cniBinDIr=/x", "cniBinDIr"),
        ("repair.fixPods=true", "fixPods"),
        ("logging.levels=debug", "levels"),
        ("resourceQuotas.size=1", "size"),
    ],
    ids=["top", "cni-prefix", "repair", "logging", "quotas"],
)
def test_a_key_neither_ours_nor_istios_is_rejected(helm: Helm, setting: str, path: str) -> None:
    proc = helm.template(sets=[setting], check=False)
    assert proc.returncode != 0
    assert names_value(proc.stderr, path), proc.stderr


def test_global_stays_open_for_an_umbrella_chart(helm: Helm) -> None:
    helm.template(sets=["global.meshID=mesh1", "global.proxy.resources.requests.cpu=10m"])


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["profile=huge"], 'unknown profile "huge"'),
        (["global.profile=huge"], 'unknown profile "huge"'),
        (["compatibilityVersion=1.0"], 'unknown compatibility version "1.0"'),
        (["global.platform=gcp"], 'unknown platform "gcp"'),
        (["env.CHAINED_CNI_PLUGIN=maybe"], "env.CHAINED_CNI_PLUGIN"),
        (["env.MONITORING_PORT=http"], "env.MONITORING_PORT"),
        (["env.FORCE_IPTABLES_BINARY=ebpf"], "env.FORCE_IPTABLES_BINARY"),
        (["env.CNI_AGENT_RUN_DIR=run"], "env.CNI_AGENT_RUN_DIR"),
    ],
    ids=[
        "profile",
        "global-profile",
        "compat",
        "global-platform",
        "env-bool",
        "env-port",
        "env-iptables",
        "env-path",
    ],
)
def test_bad_istio_values_fail_naming_them(helm: Helm, sets: list[str], message: str) -> None:
    proc = helm.template(sets=sets, check=False)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr


def test_env_reaches_the_config_and_the_container(helm: Helm) -> None:
    docs = helm.render(
        sets=[
            "env.CNI_CONF_GROUP_READ=true",
            "env.MONITORING_PORT=15020",
            "env.CNI_AGENT_RUN_DIR=/run/cni",
            "env.REPAIR_ENABLED=false",
            "env.FORCE_IPTABLES_BINARY=legacy",
            "env.ISTIO_OWNED_CNI_CONFIG=true",
            "env.ZTUNNEL_UDS_ADDRESS=/x.sock",
        ]
    )
    s = settings_from_mapping(agent_config(docs), source="config.yaml")
    assert (s.cniConfGroupRead, s.metricsPort, s.cniAgentRunDir, s.repair.enabled) == (
        True,
        15020,
        "/run/cni",
        False,
    )
    assert (s.ruleBackend, s.istioOwnedCNIConfig) == ("iptables-legacy", True)
    env = {e["name"]: e.get("value") for e in agent_container(docs)["env"]}
    assert env["ZTUNNEL_UDS_ADDRESS"] == "/x.sock" and env["MONITORING_PORT"] == "15020"


@pytest.mark.parametrize(
    ("sets", "backend"),
    [
        (["global.nativeNftables=true"], "nftables"),
        (["env.NATIVE_NFTABLES=1"], "nftables"),
        (["env.FORCE_IPTABLES_BINARY=nft"], "iptables-nft"),
        (["global.nativeNftables=true", "ruleBackend=iptables-legacy"], "iptables-legacy"),
    ],
    ids=["global", "env", "force-nft", "ours-wins-over-global"],
)
def test_rule_backend_from_istio(helm: Helm, sets: list[str], backend: str) -> None:
    assert agent_config(helm.render(sets=sets))["ruleBackend"] == backend


def test_our_new_values_reach_the_config(helm: Helm) -> None:
    config = agent_config(
        helm.render(
            sets=[
                "cniConfGroupRead=true",
                "logAsJson=true",
                "removeNotReadyTaint=true",
                "fullnameOverride=cni-node",
            ]
        )
    )
    assert config["cniConfGroupRead"] is True and config["logAsJson"] is True
    assert config["removeNotReadyTaint"] is True
    assert config["daemonSetName"] == "cni-node"
    assert agent_config(helm.render(sets=["global.logAsJson=true"]))["logAsJson"] is True


def test_image_pull_settings_from_global(helm: Helm) -> None:
    docs = helm.render()
    assert "imagePullPolicy" not in agent_container(docs)  # Kubernetes' default, as Istio
    docs = helm.render(
        sets=[
            "global.imagePullPolicy=Always",
            "global.imagePullSecrets={shared}",
            "imagePullSecrets={own}",
        ]
    )
    assert agent_container(docs)["imagePullPolicy"] == "Always"
    pod = only(docs, "DaemonSet")["spec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == [{"name": "own"}, {"name": "shared"}]
    assert only(docs, "ServiceAccount")["imagePullSecrets"] == pod["imagePullSecrets"]
    docs = helm.render(sets=["global.imagePullPolicy=Always", "pullPolicy=Never"])
    assert agent_container(docs)["imagePullPolicy"] == "Never"


def test_default_resources_from_global(helm: Helm) -> None:
    docs = helm.render(sets=["global.defaultResources.requests.cpu=50m"])
    assert agent_container(docs)["resources"]["requests"]["cpu"] == "50m"
    docs = helm.render(
        sets=["global.defaultResources.requests.cpu=50m", "resources.requests.cpu=70m"]
    )
    assert agent_container(docs)["resources"]["requests"]["cpu"] == "70m"


def test_pod_labels_and_annotations_for_istio(helm: Helm) -> None:
    ds = only(helm.render(sets=["metricsPort=15999", "podLabels.k8s-app=other"]), "DaemonSet")
    labels = ds["spec"]["template"]["metadata"]["labels"]
    assert labels["k8s-app"] == "istio-cni-node"  # istiod's untaint controller looks for it
    assert labels["sidecar.istio.io/inject"] == "false"
    assert labels["istio.io/dataplane-mode"] == "none"
    annotations = ds["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == "15999"
    assert annotations["prometheus.io/path"] == "/metrics"
    # The selector is immutable: unchanged.
    assert ds["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": "istio-cni",
        "app.kubernetes.io/instance": "istio-cni",
    }


def test_daemonset_labels_and_revision(helm: Helm) -> None:
    docs = helm.render(sets=["daemonSetLabels.team=mesh", "revision=canary"])
    ds = only(docs, "DaemonSet")
    assert ds["metadata"]["labels"]["team"] == "mesh"
    assert ds["metadata"]["labels"]["istio.io/rev"] == "canary"
    assert only(docs, "ConfigMap")["metadata"]["labels"]["istio.io/rev"] == "canary"
    assert "istio.io/rev" not in ds["spec"]["template"]["metadata"]["labels"]
    default = only(helm.render(), "DaemonSet")["metadata"]["labels"]["istio.io/rev"]
    assert default == "default"


@pytest.mark.parametrize("namespace", ["kube-system", "istio-system"])
def test_network_attachment_definition_also_in_default(helm: Helm, namespace: str) -> None:
    docs = helm.render(sets=["provider=multus", "chained=false"], namespace=namespace)
    nads = of_kind(docs, "NetworkAttachmentDefinition")
    assert sorted(n["metadata"]["namespace"] for n in nads) == sorted({namespace, "default"})


@pytest.mark.parametrize("enabled", [False, True])
def test_not_ready_taint_rbac_only_when_enabled(helm: Helm, enabled: bool) -> None:
    role = only(helm.render(sets=[f"removeNotReadyTaint={str(enabled).lower()}"]), "ClusterRole")
    grants = {(r, v) for rule in role["rules"] for r in rule["resources"] for v in rule["verbs"]}
    assert (("nodes", "patch") in grants) is enabled
    assert ("nodes", "get") in grants


@pytest.mark.parametrize(
    ("scope", "kinds"),
    [
        ("cluster", {"ClusterRole", "ClusterRoleBinding"}),
        ("namespace", {"DaemonSet", "ConfigMap", "ServiceAccount", "Role", "RoleBinding"}),
    ],
)
def test_resource_scope(helm: Helm, scope: str, kinds: set[str]) -> None:
    docs = helm.render(sets=[f"global.resourceScope={scope}"])
    assert {d["kind"] for d in docs} == kinds


def test_notes_name_ignored_istio_keys(helm4: Helm) -> None:  # noqa: F811
    text = notes(
        helm4,
        "ambient.configDir=/etc/ambient-config",
        "pilot.enabled=true",
        "trustedZtunnelNamespace=kube-system",
        "global.networkPolicy.enabled=true",
        "repair.hub=x",
        "useAppArmorAnnotation=false",
        "meshConfig.a=b",
        "env.AMBIENT_DISABLE_SAFE_UPGRADE=true",
        "env.EXCLUDE_NAMESPACES=a",
        "ambient.dnsCapture=false",
        "env.ZTUNNEL_UDS_ADDRESS=/x/z.sock",
    )
    ignored = text[text.index("Ignored:") : text.index("Check it:")]
    for key in (
        "ambient.configDir",
        "pilot",
        "global.networkPolicy",
        "trustedZtunnelNamespace",
        "repair.hub",
        "useAppArmorAnnotation",
        "meshConfig",
        "env.AMBIENT_DISABLE_SAFE_UPGRADE",
    ):
        assert f"  - {key}\n" in ignored, key
    # These have an effect here.
    for key in ("EXCLUDE_NAMESPACES", "ambient.dnsCapture", "ZTUNNEL_UDS_ADDRESS"):
        assert key not in ignored, key
    assert "WARNING: global.hub" not in text


def test_istio_values_file_installs(helm: Helm, tmp_path: Path) -> None:
    values = tmp_path / "istio.yaml"
    values.write_text(
        "profile: demo\n"
        "global:\n  hub: docker.io/istio\n  tag: 1.27.0\n  logging:\n    level: default:info\n"
        "cni:\n  cniBinDir: /var/lib/cni/bin\n  repair:\n    repairPods: false\n"
        "    deletePods: true\n  resourceQuotas:\n    enabled: true\n"
        "  env:\n    EXCLUDE_NAMESPACES: kube-system,payments\n"
        "  ambient:\n    enabled: false\n  provider: default\n  istioOwnedCNIConfigFileName: ''\n"
    )
    docs = helm.render(values=[values], namespace="istio-system")
    config = agent_config(docs)
    settings = settings_from_mapping(config, source=str(values))
    assert settings.cniBinDir == "/var/lib/cni/bin"
    assert settings.repair.mode == "delete"
    assert settings.excludeNamespaces == ("kube-system", "payments")
    assert settings.istioOwnedCNIConfigFileName == "02-istio-cni.conflist"
    assert len(of_kind(docs, "ResourceQuota")) == 1
    container = agent_container(docs)
    # Istio's registry and release tag never name this agent: its own image stays.
    assert container["image"] == f"ghcr.io/istio-cni/istio-cni:{APP_VERSION}"
    # The demo profile's requests apply: a profile is a preset, above the built-in default.
    assert container["resources"]["requests"] == {"cpu": "10m", "memory": "40Mi"}


@pytest.mark.parametrize(
    "hub", ["docker.io/istio", "gcr.io/istio-release", "gcr.io/istio-testing/"]
)
def test_an_istio_registry_from_global_is_ignored_for_the_image_with_a_warning(
    helm4: Helm,  # noqa: F811
    hub: str,
) -> None:
    text = notes(helm4, f"global.hub={hub}", "global.tag=1.27.0")
    image = f"ghcr.io/istio-cni/istio-cni:{APP_VERSION}"
    assert f"DaemonSet istio-cni: one agent per Linux node, image {image}" in text
    assert "WARNING: global.hub and global.tag name " in text
    assert f"{hub.rstrip('/')}/istio-cni:1.27.0" in text and "set hub and tag" in text


@pytest.mark.parametrize(
    "setting", ["hub=docker.io/istio", "cni.hub=gcr.io/istio-release/", "hub=docker.io/istio,tag=1"]
)
def test_an_istio_registry_given_as_our_hub_is_refused_naming_it(
    helm: Helm,
    setting: str,
) -> None:
    """An Istio values file's own `hub` names an image Istio never publishes: refused at render
    (the global.* fallback is ignored with a warning instead: it is a fallback)."""
    with pytest.raises(HelmError) as failed:
        helm.template(sets=[setting])
    message = failed.value.stderr
    assert "is one of Istio's registries, which never publish this agent" in message
    assert "leave hub out (default ghcr.io/istio-cni)" in message


def test_a_mirror_from_global_or_your_own_hub_names_the_image_without_a_warning(
    helm4: Helm,  # noqa: F811
) -> None:
    text = notes(helm4, "global.hub=mirror.example/istio", "global.tag=1.0")
    assert "image mirror.example/istio/istio-cni:1.0" in text and "WARNING: global.hub" not in text
    text = notes(helm4, "global.hub=docker.io/istio", "global.tag=1.27.0", "hub=mirror.example")
    assert (
        f"image mirror.example/istio-cni:{APP_VERSION}" in text
        and "WARNING: global.hub" not in text
    )
