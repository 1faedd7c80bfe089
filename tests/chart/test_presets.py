"""What each platform preset changes, that `--set platform=X` renders exactly what
`-f values-examples/X.yaml` renders, that values differing from their default override a preset,
and that a default given after the preset's values file is kept (with `platform` it is not)."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from testbed.helm import Helm
from tests.chart.conftest import (
    EXAMPLES,
    PLATFORMS,
    agent_config,
    agent_container,
    host_paths,
    mounts,
    of_kind,
    only,
    platform_values,
)

pytestmark = pytest.mark.chart

STD_BIN, STD_CONF, STD_NETNS = "/opt/cni/bin", "/etc/cni/net.d", "/var/run/netns"
K3S_CONF = "/var/lib/rancher/k3s/agent/etc/cni/net.d"

# What each preset must render; the paths as checked in each platform's documentation (the
# sources are cited in values-examples/<platform>.yaml).
EXPECTED: dict[str, dict[str, Any]] = {
    "default": {},
    "gke": {"bin": "/home/kubernetes/bin"},  # quota: not in kube-system, see below
    "openshift": {
        "bin": "/var/lib/cni/bin",
        "conf": "/etc/cni/multus/net.d",
        "chained": False,
        "file": "istio-cni.conf",
        "scc": "system:openshift:scc:privileged",
        "nad": True,
        "selinux": "spc_t",
    },
    "eks": {},
    "aks": {},
    "iks": {},
    "k3s": {"bin": "/var/lib/rancher/k3s/data/cni", "conf": K3S_CONF},
    "k3d": {"bin": "/bin", "conf": K3S_CONF},
    "microk8s": {
        "bin": "/var/snap/microk8s/current/opt/cni/bin",
        "conf": "/var/snap/microk8s/current/args/cni-network",
    },
    "minikube": {"netns": "/var/run/docker/netns"},
    "kind": {},
    "rke2": {"selinux": "spc_t"},
}


def test_expectations_cover_every_preset() -> None:
    assert set(EXPECTED) == {"default", *PLATFORMS}


@pytest.mark.parametrize("preset", sorted(EXPECTED))
def test_preset_renders_its_platform(helm: Helm, preset: str) -> None:
    want = EXPECTED[preset]
    docs = helm.render(values=platform_values(preset))
    paths, mnt, config = host_paths(docs), mounts(docs), agent_config(docs)

    # Host paths follow the platform; the container paths stay fixed and match the config.
    assert paths["cni-bin-dir"] == config["cniBinDir"] == want.get("bin", STD_BIN)
    assert paths["cni-conf-dir"] == config["cniConfDir"] == want.get("conf", STD_CONF)
    assert mnt[config["mountedCniBinDir"]]["name"] == "cni-bin-dir"
    assert mnt[config["mountedCniConfDir"]]["name"] == "cni-conf-dir"
    assert (config["mountedCniBinDir"], config["mountedCniConfDir"]) == (
        "/host/opt/cni/bin",
        "/host/etc/cni/net.d",
    )
    # The netns dir: at the node path (what the runtime passes) and where repair looks.
    netns = want.get("netns", STD_NETNS)
    assert paths["cni-netns-dir"] == netns
    for path in (netns, config["mountedNetnsDir"]):
        assert mnt[path]["name"] == "cni-netns-dir"
        assert mnt[path]["readOnly"] is True
        assert mnt[path]["mountPropagation"] == "HostToContainer"

    assert config["chained"] is want.get("chained", True)
    assert config["cniConfFileName"] == want.get("file", "")

    bindings = [b for b in of_kind(docs, "RoleBinding") if b["roleRef"]["kind"] == "ClusterRole"]
    if "scc" in want:
        assert [b["roleRef"]["name"] for b in bindings] == [want["scc"]]
        account = only(docs, "ServiceAccount")["metadata"]["name"]
        assert bindings[0]["subjects"][0]["name"] == account
    else:
        assert bindings == []

    nads = of_kind(docs, "NetworkAttachmentDefinition")
    if want.get("nad"):
        assert {(n["apiVersion"], n["metadata"]["name"]) for n in nads} == {
            ("k8s.cni.cncf.io/v1", "istio-cni")
        }
        # The release namespace, and `default` where Istio's chart creates it.
        assert [n["metadata"]["namespace"] for n in nads] == ["kube-system", "default"]
    else:
        assert nads == []

    selinux = agent_container(docs)["securityContext"].get("seLinuxOptions")
    assert selinux == ({"type": want["selinux"]} if "selinux" in want else None)

    quotas = of_kind(docs, "ResourceQuota")
    if want.get("quota"):
        (quota,) = quotas
        scope = quota["spec"]["scopeSelector"]["matchExpressions"][0]
        assert scope["scopeName"] == "PriorityClass"
        assert scope["values"] == ["system-node-critical"]
    else:
        assert quotas == []


@pytest.mark.parametrize("platform", PLATFORMS)
def test_set_platform_renders_the_same_as_the_values_file(helm: Helm, platform: str) -> None:
    # The config names the preset given as `platform` (the agent's messages about node paths
    # name it), so both renders name it; the file's values win over the preset's where they
    # differ, so any difference shows.
    from_file = helm.template(
        values=[EXAMPLES / f"{platform}.yaml"], sets=[f"platform={platform}"]
    ).stdout
    from_set = helm.template(sets=[f"platform={platform}"]).stdout
    # Only the set preset says what it replaced (the file gives those values).
    said = re.compile(r"^# The platform preset .*?(?=^data:)", re.MULTILINE | re.DOTALL)
    assert said.sub("", from_set) == from_file


@pytest.mark.parametrize("platform", PLATFORMS)
def test_values_file_starts_with_a_comment_naming_its_source(platform: str) -> None:
    text = (EXAMPLES / f"{platform}.yaml").read_text()
    header = "".join(line for line in text.splitlines(keepends=True) if line.startswith("#"))
    assert "platform" not in yaml.safe_load(text), "the file sets no platform: values win over it"
    assert text.startswith("# "), f"{platform}.yaml must start with a comment"
    assert "What differs" in header and "Source" in header
    assert f"--set platform={platform}" in header


@pytest.mark.parametrize(
    ("sets", "check"),
    [
        (
            ["platform=k3s", "cniBinDir=/opt/custom/bin"],
            lambda d: (
                host_paths(d)["cni-bin-dir"] == "/opt/custom/bin"
                and host_paths(d)["cni-conf-dir"] == K3S_CONF
            ),
        ),
        (
            ["platform=minikube", "cniNetnsDir=/run/netns"],
            lambda d: host_paths(d)["cni-netns-dir"] == "/run/netns",
        ),
        (
            ["platform=rke2", "seLinuxOptions.type=container_t"],
            lambda d: (
                agent_container(d)["securityContext"]["seLinuxOptions"] == {"type": "container_t"}
            ),
        ),
        (
            ["platform=openshift", "cniConfFileName=other.conf"],
            lambda d: agent_config(d)["cniConfFileName"] == "other.conf",
        ),
    ],
    ids=["bin-dir", "netns-dir", "selinux-type", "conf-file-name"],
)
def test_explicit_value_overrides_the_preset(helm: Helm, sets: list[str], check: Any) -> None:
    assert check(helm.render(sets=sets))


# A value equal to its default counts as not given (values.yaml holds the defaults, so the chart
# cannot tell it from one left alone): `platform` replaces it. The preset's values file, which
# sets no `platform`, lets the same values be given and then overridden even to a default.
KEEP_A_DEFAULT = [
    pytest.param(
        "openshift", ["chained=true"], lambda d: agent_config(d)["chained"] is True, id="chained"
    ),
    pytest.param(
        "openshift",
        ["cniConfFileName="],
        lambda d: agent_config(d)["cniConfFileName"] == "",
        id="empty-conf-file-name",
    ),
    pytest.param(
        "openshift",
        ["provider="],
        lambda d: of_kind(d, "NetworkAttachmentDefinition") == [],
        id="no-multus",
    ),
    pytest.param(
        "openshift",
        ["psp_cluster_role="],
        lambda d: all(b["roleRef"]["kind"] == "Role" for b in of_kind(d, "RoleBinding")),
        id="no-scc",
    ),
    pytest.param(
        "minikube",
        ["cniNetnsDir=/var/run/netns"],
        lambda d: host_paths(d)["cni-netns-dir"] == "/var/run/netns",
        id="netns-dir",
    ),
]


@pytest.mark.parametrize(("platform", "sets", "check"), KEEP_A_DEFAULT)
def test_a_default_given_with_the_preset_is_replaced_by_it(
    helm: Helm, platform: str, sets: list[str], check: Any
) -> None:
    assert not check(helm.render(sets=[f"platform={platform}", *sets]))


def test_what_the_preset_replaced_is_said_where_helm_template_shows_it(helm: Helm) -> None:
    """The chart cannot tell `chained=true` given from the default, so it says, in the rendered
    ConfigMap (seen by `helm template` and GitOps diffs) and in NOTES, what the preset replaced
    and how to keep a default; a value given that differs from the default is not listed."""
    text = helm.template(sets=["platform=openshift", "chained=true", "cniBinDir=/opt/x"]).stdout
    configmap = text[text.index("templates/configmap.yaml") :].split("\n---", 1)[0]
    assert "#   chained: false (default true)" in configmap
    assert "-f values-examples/openshift.yaml instead" in configmap
    assert "cniBinDir" not in configmap.split("data:")[0]
    plain = helm.template().stdout
    assert "replaced these values" not in plain


@pytest.mark.parametrize(("platform", "sets", "check"), KEEP_A_DEFAULT)
def test_a_default_given_after_the_preset_file_is_kept(
    helm: Helm, platform: str, sets: list[str], check: Any
) -> None:
    assert check(helm.render(values=[EXAMPLES / f"{platform}.yaml"], sets=sets))


def test_values_file_and_explicit_override_combine(helm: Helm) -> None:
    docs = helm.render(values=[EXAMPLES / "microk8s.yaml"], sets=["cniConfDir=/etc/cni/net.d"])
    assert host_paths(docs)["cni-bin-dir"] == "/var/snap/microk8s/current/opt/cni/bin"
    assert host_paths(docs)["cni-conf-dir"] == "/etc/cni/net.d"


def test_extra_network_attachment_namespaces(helm: Helm) -> None:
    docs = helm.render(
        sets=["platform=openshift", "networkAttachmentNamespaces={bookinfo,kube-system}"]
    )
    names = sorted(n["metadata"]["namespace"] for n in of_kind(docs, "NetworkAttachmentDefinition"))
    assert names == ["bookinfo", "default", "kube-system"]


@pytest.mark.parametrize(
    ("namespace", "sets", "quota"),
    [
        ("istio-system", [], True),
        ("kube-system", [], False),
        ("istio-system", ["resourceQuota.enabled=false"], False),
        ("istio-system", ["priorityClassName="], False),
    ],
    ids=["istio-system", "kube-system", "disabled", "no-priority-class"],
)
def test_gke_quota_for_node_critical_pods_outside_kube_system(
    helm: Helm, namespace: str, sets: list[str], quota: bool
) -> None:
    # The preset's values file: `resourceQuota.enabled=false` (the default) then wins over it.
    docs = helm.render(values=[EXAMPLES / "gke.yaml"], sets=sets, namespace=namespace)
    quotas = of_kind(docs, "ResourceQuota")
    if not quota:
        assert quotas == []  # GKE's own quota admits them there; a second one would cap them
        return
    (found,) = quotas
    assert found["metadata"]["namespace"] == namespace
    assert found["spec"]["hard"] == {"pods": "5000"}
    scope = found["spec"]["scopeSelector"]["matchExpressions"][0]
    assert (scope["scopeName"], scope["operator"], scope["values"]) == (
        "PriorityClass",
        "In",
        ["system-node-critical"],
    )
