"""The ConfigMap's config.yaml is what the agent reads: it loads with agent.config.load_settings,
names exactly the Settings keys, and holds what the values say."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from agent.config import AmbientSettings, KubeApiSettings, RepairSettings, Settings, load_settings
from testbed.helm import Helm
from tests.chart.conftest import PLATFORMS, agent_config, agent_container, only
from tests.chart.conftest import platform_values as values_of

pytestmark = pytest.mark.chart


def load_rendered(helm: Helm, tmp_path: Path, **kwargs: object) -> Settings:
    docs = helm.render(**kwargs)
    path = tmp_path / "config.yaml"
    path.write_text(only(docs, "ConfigMap")["data"]["config.yaml"])
    return load_settings(str(path))


def test_config_names_exactly_the_settings_keys(helm: Helm) -> None:
    config = agent_config(helm.render())
    assert set(config) == {f.name for f in dataclasses.fields(Settings)}
    assert set(config["repair"]) == {f.name for f in dataclasses.fields(RepairSettings)}
    assert set(config["ambient"]) == {f.name for f in dataclasses.fields(AmbientSettings)}
    assert set(config["kubeApi"]) == {f.name for f in dataclasses.fields(KubeApiSettings)}


def test_default_values_give_the_agents_defaults(helm: Helm, tmp_path: Path) -> None:
    # daemonSetName has no agent default: the chart always names its own DaemonSet.
    assert load_rendered(helm, tmp_path) == Settings(daemonSetName="istio-cni")


@pytest.mark.parametrize("platform", PLATFORMS)
def test_every_preset_loads(helm: Helm, tmp_path: Path, platform: str) -> None:
    settings = load_rendered(helm, tmp_path, values=values_of(platform))
    config = agent_config(helm.render(values=values_of(platform)))
    assert settings.cniBinDir == config["cniBinDir"]
    assert settings.cniConfDir == config["cniConfDir"]
    assert settings.chained is config["chained"]


def test_values_reach_the_config(helm: Helm, tmp_path: Path) -> None:
    settings = load_rendered(
        helm,
        tmp_path,
        sets=[
            "logLevel=debug",
            "excludeNamespaces={istio-system,payments}",
            "cniBinDir=/usr/libexec/cni",
            "cniConfDir=/etc/cni/custom.d",
            "cniConfFileName=10-calico.conflist",
            "chained=false",
            "cniAgentRunDir=/run/istio-cni",
            "istioOwnedCNIConfig=true",
            "istioOwnedCNIConfigFileName=01-istio.conflist",
            "metricsPort=16000",
            "metricsAddress=127.0.0.1",
            "ruleBackend=nftables",
            "uninstallOnStop=never",
            "conflictsPerMinuteWarning=9",
            "repair.enabled=false",
            "repair.mode=label",
            "repair.labelKey=example.com/broken",
            "repair.labelValue=yes",
            "repair.initContainerName=check",
            "kubeApi.lookupTimeoutSeconds=3",
            "kubeApi.stopTimeoutSeconds=20",
        ],
    )
    assert settings == Settings(
        cniBinDir="/usr/libexec/cni",
        cniConfDir="/etc/cni/custom.d",
        cniConfFileName="10-calico.conflist",
        chained=False,
        istioOwnedCNIConfig=True,
        istioOwnedCNIConfigFileName="01-istio.conflist",
        logLevel="debug",
        excludeNamespaces=("istio-system", "payments"),
        cniAgentRunDir="/run/istio-cni",
        metricsPort=16000,
        metricsAddress="127.0.0.1",
        ruleBackend="nftables",
        uninstallOnStop="never",
        conflictsPerMinuteWarning=9,
        daemonSetName="istio-cni",
        repair=RepairSettings(
            enabled=False,
            mode="label",
            labelKey="example.com/broken",
            labelValue="yes",
            initContainerName="check",
        ),
        kubeApi=KubeApiSettings(lookupTimeoutSeconds=3, stopTimeoutSeconds=20),
    )


def test_empty_exclude_list_loads_as_empty(helm: Helm, tmp_path: Path) -> None:
    # `[]` is "none", and so is null (Helm's merge drops the default list, as in any chart);
    # a values file without the key keeps values.yaml's default.
    empty = tmp_path / "empty.yaml"
    empty.write_text("excludeNamespaces: []\n")
    assert load_rendered(helm, tmp_path, values=[empty]).excludeNamespaces == ()
    assert load_rendered(helm, tmp_path, sets=["excludeNamespaces=null"]).excludeNamespaces == ()
    other = tmp_path / "other.yaml"
    other.write_text("logLevel: debug\n")
    assert load_rendered(helm, tmp_path, values=[other]).excludeNamespaces == (
        "istio-system",
        "kube-system",
    )


def test_container_paths_in_the_config_are_the_mounts(helm: Helm, tmp_path: Path) -> None:
    docs = helm.render(sets=["cniAgentRunDir=/run/istio-cni"])
    settings = load_rendered(helm, tmp_path, sets=["cniAgentRunDir=/run/istio-cni"])
    by_path = {m["mountPath"]: m for m in agent_container(docs)["volumeMounts"]}
    assert by_path[settings.mountedCniBinDir]["name"] == "cni-bin-dir"
    assert by_path[settings.mountedCniConfDir]["name"] == "cni-conf-dir"
    assert by_path[settings.hostProcDir]["name"] == "host-proc"
    assert by_path[settings.cniAgentRunDir]["name"] == "cni-agent-run-dir"
    assert by_path["/etc/istio-cni"]["name"] == "config"
    # The agent is started with the mounted file.
    command = agent_container(docs)["command"]
    assert command[:2] == ["istio-cni-agent", "run"]
    assert command[command.index("--config") + 1] == "/etc/istio-cni/config.yaml"


def test_config_change_rolls_the_pods(helm: Helm) -> None:
    """The agent reads config.yaml only at start (agent/lifecycle.py): a changed config reaches
    the nodes through the DaemonSet's rolling update, which the checksum starts."""

    def checksum(*sets: str) -> str:
        ds = only(helm.render(sets=list(sets)), "DaemonSet")
        return str(ds["spec"]["template"]["metadata"]["annotations"]["checksum/config"])

    unchanged = checksum()
    assert unchanged == checksum()
    # Values that are not in config.yaml keep it: no rollout for them from the checksum.
    assert unchanged == checksum("resources.requests.cpu=200m", "podLabels.team=a")
    # A value equal to its default is no change either.
    assert unchanged == checksum("logLevel=info")
    for change in ("logLevel=debug", "excludeNamespaces={kube-system}", "chained=false"):
        assert checksum(change) != unchanged, change
