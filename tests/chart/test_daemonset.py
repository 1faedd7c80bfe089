"""The agent's DaemonSet: host network, mounts, probes, downward API, labels, scheduling and a
container that is not privileged and holds only the capabilities the agent needs."""

from __future__ import annotations

from typing import Any

import pytest

from testbed.helm import Helm, HelmError
from tests.chart.conftest import agent_container, host_paths, mounts, only

pytestmark = pytest.mark.chart


def pod_spec(docs: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = only(docs, "DaemonSet")["spec"]["template"]["spec"]
    return spec


def test_container_is_unprivileged_with_only_the_needed_capabilities(helm: Helm) -> None:
    sc = agent_container(helm.render())["securityContext"]
    assert sc["privileged"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert set(sc["capabilities"]["add"]) == {
        "NET_ADMIN",
        "NET_RAW",
        "SYS_ADMIN",
        "SYS_PTRACE",
        "DAC_OVERRIDE",
        "CHOWN",
    }
    assert sc["runAsUser"] == 0
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    # The API rejects allowPrivilegeEscalation=false together with SYS_ADMIN.
    assert "allowPrivilegeEscalation" not in sc


def test_capabilities_are_each_justified_in_the_template(helm: Helm) -> None:
    text = helm.template().stdout
    block = text[text.index("capabilities:") : text.index("volumeMounts:")]
    # Chart comments do not survive rendering into YAML values, but they do into the text.
    for cap in ("NET_ADMIN", "NET_RAW", "SYS_ADMIN", "SYS_PTRACE", "DAC_OVERRIDE", "CHOWN"):
        line = block.index(f"- {cap}")
        assert block[:line].rstrip().splitlines()[-1].strip().startswith("#"), cap


def test_host_network_probes_and_ports_follow_metrics_port(helm: Helm) -> None:
    docs = helm.render(sets=["metricsPort=15999"])
    spec, c = pod_spec(docs), agent_container(docs)
    assert spec["hostNetwork"] is True
    assert spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": 15999}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": 15999}
    assert c["ports"] == [{"name": "metrics", "containerPort": 15999, "protocol": "TCP"}]


@pytest.mark.parametrize(
    ("address", "host"),
    [
        ("", None),
        ("0.0.0.0", None),
        ("::", None),
        ("127.0.0.1", "127.0.0.1"),
        ("fd00::7", "fd00::7"),
    ],
    ids=["every-address", "every-ipv4", "every-ipv6", "loopback", "one-ipv6"],
)
def test_probes_ask_the_metrics_address(helm: Helm, address: str, host: str | None) -> None:
    c = agent_container(helm.render(sets=[f"metricsAddress={address}"] if address else []))
    probes = (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz"))
    for probe, path in (*probes, ("startupProbe", "/healthz")):
        expected = {"path": path, "port": 15014, **({"host": host} if host else {})}
        assert c[probe]["httpGet"] == expected


def test_probes_tolerate_a_loaded_node(helm: Helm) -> None:
    """No 1 s timeouts (kubelet's default, missed on a busy node); a startup probe covers the
    first pod list (kubeApi.listTimeoutSeconds) so liveness never kills a slow start; a crash
    leaves its last log lines as the termination message."""
    c = agent_container(helm.render())
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert 3 <= c[probe]["timeoutSeconds"] <= 5, probe
        assert "initialDelaySeconds" not in c[probe], probe
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 60 + 30
    slow = agent_container(helm.render(sets=["kubeApi.listTimeoutSeconds=300"]))["startupProbe"]
    assert slow["periodSeconds"] * slow["failureThreshold"] >= 300 + 30
    assert c["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_downward_api_environment(helm: Helm) -> None:
    env = {
        e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"]
        for e in agent_container(helm.render())["env"]
    }
    assert env == {
        "NODE_NAME": "spec.nodeName",
        "POD_NAME": "metadata.name",
        "POD_NAMESPACE": "metadata.namespace",
        "POD_UID": "metadata.uid",
    }


def test_host_mounts(helm: Helm) -> None:
    docs = helm.render(sets=["cniAgentRunDir=/run/istio-cni"])
    paths, mnt = host_paths(docs), mounts(docs)
    assert paths["cni-agent-run-dir"] == "/run/istio-cni"
    assert mnt["/run/istio-cni"]["name"] == "cni-agent-run-dir"  # same path as on the node
    assert paths["host-proc"] == "/proc"
    assert mnt["/host/proc"] == {"name": "host-proc", "mountPath": "/host/proc", "readOnly": True}
    assert mnt["/etc/istio-cni"]["readOnly"] is True
    volumes = {v["name"]: v for v in pod_spec(docs)["volumes"]}
    assert volumes["config"]["configMap"]["name"] == only(docs, "ConfigMap")["metadata"]["name"]
    assert volumes["cni-agent-run-dir"]["hostPath"]["type"] == "DirectoryOrCreate"
    # Only the dirs the agent writes are writable.
    writable = {p for p, m in mnt.items() if not m.get("readOnly")}
    assert writable == {
        "/host/opt/cni/bin",
        "/host/etc/cni/net.d",
        "/run/istio-cni",
        "/run/xtables.lock",
        "/tmp",
    }


def test_scheduling_defaults_reach_every_linux_node(helm: Helm) -> None:
    spec = pod_spec(helm.render())
    assert spec["tolerations"] == [{"operator": "Exists"}]
    assert spec["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert spec["priorityClassName"] == "system-node-critical"
    assert spec["terminationGracePeriodSeconds"] == 30
    ds = only(helm.render(), "DaemonSet")
    assert ds["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 1},
    }


def test_operator_settings_reach_the_pod(helm: Helm) -> None:
    docs = helm.render(
        sets=[
            "tolerations[0].key=dedicated",
            "tolerations[0].operator=Equal",
            "tolerations[0].value=mesh",
            "nodeSelector.pool=mesh",
            "priorityClassName=",
            "podAnnotations.team=net",
            "podLabels.tier=node",
            "imagePullSecrets={regcred}",
            "resources.limits.memory=200Mi",
            "pullPolicy=Always",
            "updateStrategy.type=OnDelete",
            "updateStrategy.rollingUpdate=null",
            "appArmorProfile.type=Unconfined",
            "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
            ".nodeSelectorTerms[0].matchExpressions[0].key=mesh",
            "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
            ".nodeSelectorTerms[0].matchExpressions[0].operator=Exists",
        ]
    )
    ds = only(docs, "DaemonSet")
    spec, c = pod_spec(docs), agent_container(docs)
    assert spec["tolerations"] == [{"key": "dedicated", "operator": "Equal", "value": "mesh"}]
    assert spec["nodeSelector"] == {"kubernetes.io/os": "linux", "pool": "mesh"}
    assert "priorityClassName" not in spec
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert spec["affinity"]["nodeAffinity"]
    assert ds["spec"]["template"]["metadata"]["annotations"]["team"] == "net"
    assert ds["spec"]["template"]["metadata"]["labels"]["tier"] == "node"
    assert c["resources"]["limits"] == {"memory": "200Mi"}
    assert c["imagePullPolicy"] == "Always"
    assert c["securityContext"]["appArmorProfile"] == {"type": "Unconfined"}
    assert ds["spec"]["updateStrategy"] == {"type": "OnDelete"}


def test_standard_labels_and_stable_selector(helm: Helm) -> None:
    docs = helm.render()
    for doc in docs:
        labels = doc["metadata"]["labels"]
        hook = (doc["metadata"].get("annotations") or {}).get("helm.sh/hook")
        # `helm test`'s pod and namespace: not the agent's selector labels.
        name = "istio-cni-test" if hook == "test" else "istio-cni"
        assert labels["app.kubernetes.io/name"] == name, doc["kind"]
        assert labels["app.kubernetes.io/instance"] == "istio-cni"
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["app.kubernetes.io/version"] == "0.1.0"
        assert labels["app.kubernetes.io/part-of"] == "istio"
    ds = only(docs, "DaemonSet")
    selector = ds["spec"]["selector"]["matchLabels"]
    assert selector == {
        "app.kubernetes.io/name": "istio-cni",
        "app.kubernetes.io/instance": "istio-cni",
    }
    assert selector.items() <= ds["spec"]["template"]["metadata"]["labels"].items()


@pytest.mark.parametrize(
    ("sets", "image"),
    [
        ([], "ghcr.io/istio-cni/istio-cni:0.1.0"),
        (
            ["global.hub=mirror.example/istio", "global.tag=1.0"],
            "mirror.example/istio/istio-cni:1.0",
        ),
        (
            ["hub=own.example", "global.hub=mirror.example", "tag=2.0", "global.tag=1.0"],
            "own.example/istio-cni:2.0",
        ),
        (
            [f"digest=sha256:{'ab' * 32}"],
            f"ghcr.io/istio-cni/istio-cni:0.1.0@sha256:{'ab' * 32}",
        ),
        (
            ["image=registry.example/x/agent:9", f"digest=sha256:{'cd' * 32}"],
            f"registry.example/x/agent:9@sha256:{'cd' * 32}",
        ),
    ],
    ids=["default", "global", "own-wins", "digest", "full-image-digest"],
)
def test_image_hub_and_tag(helm: Helm, sets: list[str], image: str) -> None:
    assert agent_container(helm.render(sets=sets))["image"] == image


@pytest.mark.parametrize("digest", ["sha256:zz", "md5:" + "a" * 32, "sha256:" + "A" * 64])
def test_a_malformed_digest_is_refused_naming_the_value(helm: Helm, digest: str) -> None:
    with pytest.raises(HelmError) as refused:
        helm.render(sets=[f"digest={digest}"])
    assert "digest" in str(refused.value)
