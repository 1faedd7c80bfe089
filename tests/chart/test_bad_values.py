"""values.schema.json: a bad value makes `helm template`, `helm lint` and `helm install` fail with
a message that names the value (Helm 3 says `repair.mode:`, Helm 4 says `at '/repair/mode'`)."""

from __future__ import annotations

import pytest

from testbed.helm import CHART, Helm

pytestmark = pytest.mark.chart

# (--set argument, path of the value the error must name)
BAD_VALUES = [
    pytest.param("cniBinDir=opt/cni/bin", "cniBinDir", id="bin-dir-relative"),
    pytest.param("cniConfDir=etc/cni", "cniConfDir", id="conf-dir-relative"),
    pytest.param("cniNetnsDir=run/netns", "cniNetnsDir", id="netns-dir-relative"),
    pytest.param("cniAgentRunDir=istio-cni", "cniAgentRunDir", id="run-dir-relative"),
    pytest.param("cniConfFileName=net.d/10-x.conflist", "cniConfFileName", id="conf-file-path"),
    pytest.param("logLevel=verbose", "logLevel", id="log-level"),
    pytest.param("pullPolicy=Sometimes", "pullPolicy", id="pull-policy"),
    pytest.param("platform=gcp", "platform", id="platform"),
    pytest.param("repair.mode=restart", "repair.mode", id="repair-mode"),
    pytest.param("repair.enabled=maybe", "repair.enabled", id="repair-enabled-type"),
    pytest.param("chained=yes", "chained", id="chained-type"),
    pytest.param("metricsPort=70000", "metricsPort", id="metrics-port-range"),
    pytest.param("metricsPort=port", "metricsPort", id="metrics-port-type"),
    pytest.param("ruleBackend=ebpf", "ruleBackend", id="rule-backend"),
    pytest.param("uninstallOnStop=sometimes", "uninstallOnStop", id="uninstall-on-stop"),
    pytest.param("excludeNamespaces[0]=Kube_System", "excludeNamespaces.0", id="namespace-name"),
    pytest.param("provider=calico", "provider", id="provider"),
    pytest.param("seLinuxOptions.kind=spc_t", "seLinuxOptions", id="selinux-unknown-field"),
    pytest.param("cniBinDIr=/opt/cni/bin", "cniBinDIr", id="misspelt-value"),
    pytest.param("resourceQuota.pods=0", "resourceQuota.pods", id="quota-pods"),
    # Kubernetes-typed values, by Kubernetes' own schemas (ci/chart-schema).
    pytest.param(
        "tolerations[0].operater=Exists", "tolerations.0.operater", id="toleration-misspelt"
    ),
    pytest.param(
        "tolerations[0].operator=Sometimes", "tolerations.0.operator", id="toleration-operator"
    ),
    pytest.param("resources.requests.cpu=lots", "resources.requests.cpu", id="resources-quantity"),
    pytest.param("resources.request.cpu=1", "resources.request", id="resources-misspelt"),
    pytest.param("imagePullSecrets[0].nam=reg", "imagePullSecrets.0", id="pull-secret-key"),
    pytest.param(
        "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
        ".nodeSelectorTerms[0].matchExpressions[0].key=pool",
        "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
        ".nodeSelectorTerms.0.matchExpressions.0",
        id="affinity-operator-required",
    ),
    pytest.param("seccompProfile.type=Sometimes", "seccompProfile.type", id="seccomp-type"),
    pytest.param("updateStrategy.type=Never", "updateStrategy.type", id="update-strategy-type"),
    # What the API server checks beyond the document's types (ci/chart-schema CHECKS).
    pytest.param("resources.limits.memry=1Gi", "resources.limits.memry", id="resource-name"),
    pytest.param(
        "global.defaultResources.requests.cpus=1",
        "global.defaultResources.requests.cpus",
        id="default-resource-name",
    ),
    pytest.param(
        "updateStrategy.rollingUpdate.maxUnavailable=0",
        "updateStrategy.rollingUpdate",
        id="rollout-that-cannot-move",
    ),
    pytest.param(
        "updateStrategy.rollingUpdate.maxUnavailable=lots",
        "updateStrategy.rollingUpdate.maxUnavailable",
        id="rollout-number",
    ),
    pytest.param(
        "tolerations[0].operator=Exists,tolerations[0].value=x",
        "tolerations.0.value",
        id="toleration-exists-with-value",
    ),
]


def names_value(message: str, path: str) -> bool:
    parts = path.split(".")
    return (
        f"- {path}:" in message  # Helm 3
        or f"at '/{'/'.join(parts)}'" in message  # Helm 4
        or f"additional property {parts[-1]} ".lower() in message.lower()  # Helm 3, unknown key
        or f"additional properties '{parts[-1]}'" in message  # Helm 4, unknown key
        or f'Property name of "{parts[-1]}" does not match' in message  # Helm 3, a map's key
        or f"invalid propertyName '{parts[-1]}'" in message  # Helm 4, a map's key
    )


@pytest.mark.parametrize(("setting", "path"), BAD_VALUES)
def test_helm_template_rejects_bad_value_naming_it(helm: Helm, setting: str, path: str) -> None:
    proc = helm.template(sets=[setting], check=False)
    assert proc.returncode != 0, f"{setting} was accepted"
    assert "values don't meet the specifications of the schema" in proc.stderr
    assert names_value(proc.stderr, path), proc.stderr


@pytest.mark.parametrize(("setting", "path"), BAD_VALUES[:6])
def test_helm_lint_rejects_bad_value_naming_it(helm: Helm, setting: str, path: str) -> None:
    proc = helm.call("lint", "--strict", str(CHART), "--set", setting, check=False)
    assert proc.returncode != 0
    assert names_value(proc.stdout + proc.stderr, path), proc.stdout + proc.stderr


@pytest.mark.parametrize(("setting", "path"), BAD_VALUES[:6])
def test_helm_install_rejects_bad_value_naming_it(helm: Helm, setting: str, path: str) -> None:
    # Helm 4 validates a client-side dry run without a cluster; Helm 3 would first dial one, so
    # it runs against the real API server in tests/testbed instead.
    if helm.version.startswith("3."):
        proc = helm.template(sets=[setting], check=False)
    else:
        proc = helm.call(
            "install",
            "istio-cni",
            str(CHART),
            "--namespace",
            "kube-system",
            "--dry-run=client",
            "--set",
            setting,
            check=False,
        )
    assert proc.returncode != 0
    assert names_value(proc.stderr, path), proc.stderr


def test_good_values_of_every_kind_are_accepted(helm: Helm) -> None:
    helm.template(
        sets=[
            "cniBinDir=/opt/cni/bin",
            "logLevel=debug",
            "pullPolicy=Always",
            "platform=kind",
            "repair.mode=label",
            "chained=false",
            "metricsPort=15020",
            "ruleBackend=nftables",
            "uninstallOnStop=never",
            "excludeNamespaces={a,b-c}",
            "provider=multus",
            "seLinuxOptions.type=spc_t",
            "resourceQuota.pods=10",
            "cniConfFileName=10-x.conflist",
        ]
    )


def test_kubernetes_typed_values_of_every_form_are_accepted(helm: Helm) -> None:
    docs = helm.render(
        sets=[
            "imagePullSecrets[0]=by-name",
            "imagePullSecrets[1].name=as-kubernetes-writes-it",
            "global.imagePullSecrets[0].name=from-global",
            "tolerations[0].key=dedicated",
            "tolerations[0].operator=Equal",
            "tolerations[0].value=mesh",
            "tolerations[0].effect=NoSchedule",
            "tolerations[0].tolerationSeconds=30",
            "resources.requests.cpu=1",
            "resources.limits.memory=1Gi",
            "resources.limits.hugepages-2Mi=64Mi",
            "resources.limits.example\\.com/dongle=1",
            "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
            ".nodeSelectorTerms[0].matchExpressions[0].key=pool",
            "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
            ".nodeSelectorTerms[0].matchExpressions[0].operator=In",
            "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
            ".nodeSelectorTerms[0].matchExpressions[0].values[0]=mesh",
            "appArmorProfile.type=Unconfined",
            "updateStrategy.type=OnDelete",
        ]
    )
    spec = next(d for d in docs if d["kind"] == "DaemonSet")["spec"]
    pod = spec["template"]["spec"]
    assert pod["imagePullSecrets"] == [
        {"name": "by-name"},
        {"name": "as-kubernetes-writes-it"},
        {"name": "from-global"},
    ]
    assert pod["tolerations"][0]["tolerationSeconds"] == 30
    assert pod["containers"][0]["resources"] == {
        "requests": {"cpu": 1, "memory": "100Mi"},  # merged with the default, as Helm merges
        "limits": {"memory": "1Gi", "hugepages-2Mi": "64Mi", "example.com/dongle": 1},
    }
    assert spec["updateStrategy"] == {"type": "OnDelete"}  # no rollingUpdate left from the default


@pytest.mark.parametrize(
    "sets",
    [
        [
            "updateStrategy.rollingUpdate.maxUnavailable=0",
            "updateStrategy.rollingUpdate.maxSurge=1",
        ],
        ["updateStrategy.rollingUpdate.maxUnavailable=10%"],
    ],
    ids=["surge", "percent"],
)
def test_rollouts_that_move_are_accepted(helm: Helm, sets: list[str]) -> None:
    docs = helm.render(sets=sets)
    strategy = next(d for d in docs if d["kind"] == "DaemonSet")["spec"]["updateStrategy"]
    assert strategy["type"] == "RollingUpdate" and strategy["rollingUpdate"]
