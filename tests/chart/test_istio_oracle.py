"""Istio's own istio-cni chart (tests/testdata/istio-chart, rendered by the same real Helm) is the
oracle: a values file written for it installs ours with the same effect. Each case renders both
charts with the same values and compares the settings that matter, extracted from each render.

Where ours differs by design the comparison says so, with the reason:
- the image is `<hub>/istio-cni:<tag>` where Istio's is `<hub>/install-cni:<tag>` (another
  program); a full `image` reference is used as given by both;
- our default excludeNamespaces adds istio-system (Istio's agent skips its own namespace in code);
- ours creates the NetworkAttachmentDefinition in the release namespace too, besides `default`;
- a profile's global.* (ambient's `variant: distroless`) is ignored: we publish no variants;
- ambient's RBAC is ours: `namespaces` read (Istio grants it to every install) and `pods/status`
  patch (Istio adds update, which the agent never sends); the agent reads its own DaemonSet through
  the namespaced Role every install has; the node's netns dir is mounted with HostToContainer
  propagation whether ambient is on or not (repair needs it too).
- a value you set wins over a profile's whatever its spelling; Istio's chart lets a profile's
  `cni.X` (ambient's `cni.ambient.enabled`) overwrite your unprefixed `X`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.config import settings_from_mapping
from agent.label_selectors import EnablementSelector, parse_enablement_selectors
from testbed.helm import CHART, Helm
from testbed.parts import REPO_ROOT
from tests.chart.conftest import agent_config, mounts, of_kind, only
from tests.chart.test_rbac import grants

pytestmark = pytest.mark.chart

ISTIO_CHART = REPO_ROOT / "tests" / "testdata" / "istio-chart"
NAMESPACE = "istio-system"  # Istio's usual one; ours never creates a quota in kube-system
BASE = ["global.hub=reg.example/istio", "global.tag=1.2.3"]
ISTIO_PROFILES = sorted(
    p.stem.removeprefix("profile-") for p in (ISTIO_CHART / "files").glob("profile-*.yaml")
)
ISTIO_PLATFORMS = sorted(
    p.removeprefix("platform-") for p in ISTIO_PROFILES if p.startswith("platform-")
)


def render(
    helm: Helm, chart: Path, sets: list[str], values: list[Path], kube_version: str | None
) -> list[dict[str, Any]]:
    args = ["template", "istio-cni", str(chart), "--namespace", NAMESPACE]
    if kube_version:
        args += ["--kube-version", kube_version]
    for v in values:
        args += ["--values", str(v)]
    for s in [*BASE, *sets]:
        args += ["--set", s]
    return [d for d in yaml.safe_load_all(helm.run(*args)) if d]


def repair_of(enabled: bool, repair: bool, delete: bool, label: bool) -> str:
    """Istio's repair controller: repairPods > deletePods > labelPods, else no action."""
    if not enabled:
        return "off"
    return "repair-in-place" if repair else "delete" if delete else "label" if label else "off"


AMBIENT_GRANTS = {
    ("", "namespaces", "get"),
    ("", "namespaces", "list"),
    ("", "namespaces", "watch"),
    ("", "pods/status", "patch"),
}


def selectors(parsed: tuple[EnablementSelector, ...]) -> list[dict[str, Any]]:
    return [s.to_dict() for s in parsed]


def all_grants(docs: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {g for role in of_kind(docs, "ClusterRole") for g in grants(role["rules"])}


def istio_settings(docs: list[dict[str, Any]]) -> dict[str, Any]:
    ds = only(docs, "DaemonSet")
    container = ds["spec"]["template"]["spec"]["containers"][0]
    data = next(
        d for d in of_kind(docs, "ConfigMap") if d["metadata"]["name"] == "istio-cni-config"
    )["data"]
    # The container's env wins over the ConfigMap it also reads (envFrom), as in the kubelet.
    env = {**data, **{e["name"]: e["value"] for e in container["env"] if "value" in e}}
    paths = {
        v["name"]: v["hostPath"]["path"]
        for v in ds["spec"]["template"]["spec"]["volumes"]
        if "hostPath" in v
    }
    level = next(
        (
            a.split("=", 1)[1]
            for a in container.get("args", [])
            if a.startswith("--log_output_level=")
        ),
        "info",
    )
    quotas = of_kind(docs, "ResourceQuota")

    def flag(name: str) -> bool:
        return str(env[name]).lower() == "true"

    return {
        "cniBinDir": paths["cni-bin-dir"],
        "cniConfDir": paths["cni-net-dir"],
        "cniNetnsDir": paths["cni-netns-dir"],
        "cniConfFileName": env.get("CNI_CONF_NAME", ""),
        "chained": flag("CHAINED_CNI_PLUGIN"),
        "nad": sorted(
            n["metadata"]["namespace"] for n in of_kind(docs, "NetworkAttachmentDefinition")
        ),
        "repair": repair_of(
            flag("REPAIR_ENABLED"),
            flag("REPAIR_REPAIR_PODS"),
            flag("REPAIR_DELETE_PODS"),
            flag("REPAIR_LABEL_PODS"),
        ),
        "logLevel": level,
        "quota": int(quotas[0]["spec"]["hard"]["pods"]) if quotas else None,
        "image": container["image"],
        "excludeNamespaces": [n for n in env["EXCLUDE_NAMESPACES"].split(",") if n],
        "ambient": {
            "enabled": flag("AMBIENT_ENABLED"),
            "dnsCapture": flag("AMBIENT_DNS_CAPTURE"),
            "ipv6": flag("AMBIENT_IPV6"),
            "reconcileIptablesOnStartup": flag("AMBIENT_RECONCILE_POD_RULES_ON_STARTUP"),
            "enableAmbientDetectionRetry": flag("ENABLE_AMBIENT_DETECTION_RETRY"),
            # What Istio's agent parses: the YAML text, through the same selector rules.
            "enablementSelectors": selectors(
                parse_enablement_selectors(yaml.safe_load(env["AMBIENT_ENABLEMENT_SELECTOR"]))
            ),
            "socketDir": paths.get("cni-ztunnel-sock-dir"),
            "rbac": any(
                r["metadata"]["name"].endswith("-ambient") for r in of_kind(docs, "ClusterRole")
            ),
        },
        "_grants": all_grants(docs),
        "_netnsPropagation": next(
            (
                m.get("mountPropagation")
                for m in container["volumeMounts"]
                if m["mountPath"] == "/host/var/run/netns"
            ),
            None,
        ),
    }


def our_settings(docs: list[dict[str, Any]]) -> dict[str, Any]:
    config = agent_config(docs)
    settings = settings_from_mapping(config, source="rendered config.yaml")  # the agent loads it
    ds = only(docs, "DaemonSet")
    paths = {
        v["name"]: v["hostPath"]["path"]
        for v in ds["spec"]["template"]["spec"]["volumes"]
        if "hostPath" in v
    }
    quotas = of_kind(docs, "ResourceQuota")
    return {
        "cniBinDir": paths["cni-bin-dir"],
        "cniConfDir": paths["cni-conf-dir"],
        "cniNetnsDir": paths["cni-netns-dir"],
        "cniConfFileName": settings.cniConfFileName,
        "chained": settings.chained,
        "nad": sorted(
            n["metadata"]["namespace"] for n in of_kind(docs, "NetworkAttachmentDefinition")
        ),
        "repair": settings.repair.mode if settings.repair.enabled else "off",
        "logLevel": settings.logLevel,
        "quota": int(quotas[0]["spec"]["hard"]["pods"]) if quotas else None,
        "image": ds["spec"]["template"]["spec"]["containers"][0]["image"],
        "excludeNamespaces": list(settings.excludeNamespaces),
        "ambient": {
            "enabled": settings.ambient.enabled,
            "dnsCapture": settings.ambient.dnsCapture,
            "ipv6": settings.ambient.ipv6,
            "reconcileIptablesOnStartup": settings.ambient.reconcileIptablesOnStartup,
            "enableAmbientDetectionRetry": settings.ambient.enableAmbientDetectionRetry,
            "enablementSelectors": selectors(settings.ambient.enablementSelectors),
            "socketDir": paths.get("ztunnel-socket-dir"),
            "rbac": all_grants(docs) >= AMBIENT_GRANTS,
        },
        "_grants": all_grants(docs),
        "_netnsPropagation": {
            path: m.get("mountPropagation")
            for path, m in mounts(docs).items()
            if path in (settings.mountedNetnsDir, paths["cni-netns-dir"])
        },
    }


def compare(
    helm: Helm,
    sets: list[str],
    values: list[Path] = (),  # type: ignore[assignment]
    kube_version: str | None = None,
    *,
    variant_ignored: bool = False,
) -> None:
    theirs = istio_settings(render(helm, ISTIO_CHART, sets, list(values), kube_version))
    ours = our_settings(render(helm, CHART, sets, list(values), kube_version))

    # By design: our image is istio-cni where Istio's is install-cni (a full reference is kept).
    want_image = theirs.pop("image")
    if not any(s.startswith("image=") and "/" in s for s in sets):
        want_image = want_image.replace("/install-cni:", "/istio-cni:")
    if variant_ignored:
        want_image = want_image.removesuffix("-distroless")
    assert ours.pop("image") == want_image
    # By design: our default also excludes istio-system; compare only when the values set it.
    their_ns, our_ns = theirs.pop("excludeNamespaces"), ours.pop("excludeNamespaces")
    if their_ns == ["kube-system"]:
        assert our_ns == ["istio-system", "kube-system"]
    else:
        assert our_ns == their_ns
    # By design: the NetworkAttachmentDefinition is also in the release namespace.
    their_nad, our_nad = theirs.pop("nad"), ours.pop("nad")
    assert set(their_nad) <= set(our_nad)
    assert (NAMESPACE in our_nad) == bool(their_nad)
    # By design: our ambient rights are a subset of Istio's; the netns mounts always propagate.
    their_grants, our_grants = theirs.pop("_grants"), ours.pop("_grants")
    if theirs["ambient"]["rbac"]:
        assert their_grants >= AMBIENT_GRANTS
    if ours["ambient"]["rbac"]:
        assert their_grants >= our_grants & AMBIENT_GRANTS
    their_propagation = theirs.pop("_netnsPropagation")
    our_propagation = ours.pop("_netnsPropagation")
    assert set(our_propagation.values()) == {"HostToContainer"} and len(our_propagation) == 2
    assert their_propagation in (None, "HostToContainer")
    assert ours == theirs


@pytest.mark.parametrize("profile", ISTIO_PROFILES)
def test_every_istio_profile(helm: Helm, profile: str) -> None:
    compare(helm, [f"profile={profile}"], variant_ignored=profile == "ambient")


@pytest.mark.parametrize("key", ["global.platform", "platform"])
@pytest.mark.parametrize("platform", ISTIO_PLATFORMS)
def test_every_istio_platform(helm: Helm, platform: str, key: str) -> None:
    # Istio's chart finds GKE's bin dir from the API server's version (its gke profile leaves
    # cniBinDir empty); a `-gke` version lets both charts see a GKE cluster.
    compare(
        helm, [f"{key}={platform}"], kube_version="v1.31.0-gke.100" if platform == "gke" else None
    )


@pytest.mark.parametrize("platform", ISTIO_PLATFORMS)
def test_istio_platform_profile_as_a_values_file(helm: Helm, platform: str) -> None:
    path = ISTIO_CHART / "files" / f"profile-platform-{platform}.yaml"
    compare(helm, [], values=[path], kube_version="v1.31.0-gke.100" if platform == "gke" else None)


@pytest.mark.parametrize(
    "version",
    sorted(
        p.stem.removeprefix("profile-compatibility-version-")
        for p in (ISTIO_CHART / "files").glob("profile-compatibility-version-*.yaml")
    ),
)
def test_every_compatibility_version(helm: Helm, version: str) -> None:
    compare(helm, [f"compatibilityVersion={version}"])


EXAMPLES = {
    "cni-bin-dir": ["cni.cniBinDir=/usr/libexec/cni"],
    "cni-prefix-paths": [
        "cni.cniConfDir=/etc/cni/custom.d",
        "cni.cniNetnsDir=/run/netns",
        "cni.cniConfFileName=10-calico.conflist",
    ],
    "delete-pods": ["repair.deletePods=true", "repair.repairPods=false"],
    "delete-pods-but-repair-default-wins": ["repair.deletePods=true"],
    "label-pods": ["repair.labelPods=true", "repair.repairPods=false"],
    "no-repair-action": ["repair.repairPods=false"],
    "repair-disabled": ["repair.enabled=false"],
    "plugin-log-level": ["global.logging.level=cni-plugin:debug"],
    "log-level": ["logging.level=default:warn\\,cni-plugin:debug"],
    "multus": ["cni.chained=false", "provider=multus"],
    "provider-default": ["provider=default"],
    "resource-quotas": ["resourceQuotas.enabled=true", "resourceQuotas.pods=100"],
    "image-reference": ["image=reg/x/install-cni:1.2"],
    "image-name": ["image=my-cni", "hub=mirror.example/mesh", "tag=9.9"],
    "variant": ["variant=distroless"],
    "global-variant": ["global.variant=debug"],
    "exclude-namespaces-env": ["env.EXCLUDE_NAMESPACES=a\\,b"],
    "exclude-namespaces": ["excludeNamespaces={kube-system,payments}"],
    "conf-name-env": ["env.CNI_CONF_NAME=10-flannel.conflist"],
    "chained-env": ["env.CHAINED_CNI_PLUGIN=false"],
    "repair-env": ["env.REPAIR_REPAIR_PODS=false", "env.REPAIR_LABEL_PODS=true"],
    "ambient": ["ambient.enabled=true"],
    "ambient-cni-prefix": ["cni.ambient.enabled=true"],
    "ambient-global-profile": ["global.profile=ambient"],
    # Istio's profile sets cni.ambient.enabled, which its chart copies over an unprefixed
    # ambient.enabled=false; ours lets the user's value win either way (test_ambient_values).
    "ambient-profile-off": ["profile=ambient", "cni.ambient.enabled=false"],
    "ambient-no-dns": ["ambient.enabled=true", "ambient.dnsCapture=false"],
    "ambient-no-ipv6": ["ambient.enabled=true", "ambient.ipv6=false"],
    "ambient-no-reconcile": ["ambient.enabled=true", "ambient.reconcileIptablesOnStartup=false"],
    "ambient-detection-retry": ["ambient.enabled=true", "ambient.enableAmbientDetectionRetry=true"],
    "ambient-share-host-netns": ["ambient.enabled=true", "ambient.shareHostNetworkNamespace=true"],
    "ambient-options-while-off": ["ambient.dnsCapture=false", "ambient.ipv6=false"],
    "ambient-compat-1.25": ["profile=ambient", "compatibilityVersion=1.25"],
    "ambient-env-dns": ["ambient.enabled=true", "env.AMBIENT_DNS_CAPTURE=false"],
    "ambient-env-ipv6": ["ambient.enabled=true", "env.AMBIENT_IPV6=false"],
    "ambient-env-reconcile": [
        "ambient.enabled=true",
        "env.AMBIENT_RECONCILE_POD_RULES_ON_STARTUP=false",
    ],
    "ambient-env-retry": ["ambient.enabled=true", "env.ENABLE_AMBIENT_DETECTION_RETRY=true"],
    "ambient-with-label-repair": [
        "ambient.enabled=true",
        "repair.labelPods=true",
        "repair.repairPods=false",
    ],
}


@pytest.mark.parametrize("sets", EXAMPLES.values(), ids=EXAMPLES.keys())
def test_istio_example_values(helm: Helm, sets: list[str]) -> None:
    compare(helm, sets, variant_ignored=any(s.endswith("profile=ambient") for s in sets))


SELECTOR_FILES = {
    "pod-label-only": """\
ambient:
  enabled: true
  enablementSelectors:
    - podSelector:
        matchLabels: {istio.io/dataplane-mode: ambient}
""",
    "namespace-expressions": """\
cni:
  ambient:
    enabled: true
    enablementSelectors:
      - podSelector:
          matchExpressions:
            - {key: istio.io/dataplane-mode, operator: NotIn, values: [none]}
        namespaceSelector:
          matchExpressions:
            - {key: team, operator: In, values: [a, b]}
            - {key: legacy, operator: DoesNotExist}
""",
    "everything": "ambient:\n  enabled: true\n  enablementSelectors: [{}]\n",
    "nothing": "ambient:\n  enabled: true\n  enablementSelectors: []\n",
}


@pytest.mark.parametrize("text", SELECTOR_FILES.values(), ids=SELECTOR_FILES.keys())
def test_istio_ambient_enablement_selectors(helm: Helm, tmp_path: Path, text: str) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(text)
    compare(helm, [], values=[values])
