"""The plugin entry: what the plugin needs, and nothing that changes with only the agent pod."""

from __future__ import annotations

import pytest

from agent.config import AmbientSettings, Settings
from agent.install.entry import agent_pod_prefix, plugin_entry, standalone_entry
from plugin.commands import Pod, is_agent_pod
from plugin.config import parse
from plugin.fastjson import dumps


def test_entry_is_the_same_for_every_pod_of_the_daemonset() -> None:
    settings = Settings(daemonSetName="istio-cni-node")
    entries = [
        plugin_entry(settings, pod_name=name, pod_namespace="istio-system")
        for name in ("istio-cni-node-abcde", "istio-cni-node-x9z8y", "")
    ]
    assert entries[0] == entries[1] == entries[2]
    assert entries[0] == {
        "name": "istio-cni",
        "type": "istio-cni",
        "plugin_log_level": "info",
        "cni_agent_run_dir": "/var/run/istio-cni",
        "exclude_namespaces": ["istio-system", "kube-system"],
        "pod_namespace": "istio-system",
        "ambient_enabled": False,
        "capabilities": {"io.kubernetes.cri.pod-annotations": True},
        "agent_pod_prefix": "istio-cni-node-",
    }


def test_without_daemonset_name_the_prefix_comes_from_the_pod_name() -> None:
    settings = Settings()
    assert agent_pod_prefix(settings, "my-cni-7f9kq") == "my-cni-"
    a = plugin_entry(settings, pod_name="istio-cni-node-abcde", pod_namespace="ns")
    b = plugin_entry(settings, pod_name="istio-cni-node-zzzzz", pod_namespace="ns")
    assert a == b and a["agent_pod_prefix"] == "istio-cni-node-"
    assert "agent_pod_prefix" not in plugin_entry(settings, pod_name="", pod_namespace="ns")
    assert "agent_pod_prefix" not in plugin_entry(settings, pod_name="nodash", pod_namespace="")


def test_long_daemonset_name_is_cut_as_the_api_server_cuts_generate_name() -> None:
    name = "d" * 70
    assert agent_pod_prefix(Settings(daemonSetName=name), "") == "d" * 58


@pytest.mark.parametrize(
    ("spec", "plugin"),
    [
        ("debug", "debug"),
        ("none", "none"),
        ("default:warn,cni-plugin:debug", "debug"),
        ("cni-agent:debug,repair:error", "info"),
        ("all:error", "error"),
    ],
)
def test_plugin_log_level_is_a_plain_level(spec: str, plugin: str) -> None:
    entry = plugin_entry(Settings(logLevel=spec), pod_name="", pod_namespace="ns")
    assert entry["plugin_log_level"] == plugin


def test_log_as_json_only_when_set() -> None:
    assert "log_as_json" not in plugin_entry(Settings(), pod_name="", pod_namespace="ns")
    entry = standalone_entry(Settings(logAsJson=True), pod_name="", pod_namespace="ns")
    assert entry["log_as_json"] is True and entry["cniVersion"] == "1.0.0"


def test_the_plugin_reads_the_entry_it_is_given() -> None:
    settings = Settings(
        logLevel="default:info,cni-plugin:none", logAsJson=True, daemonSetName="cni"
    )
    entry = standalone_entry(settings, pod_name="", pod_namespace="istio-system")
    conf = parse(dumps(entry).encode(), command="ADD")
    assert (conf.log_level, conf.log_as_json) == ("none", True)
    assert (conf.pod_namespace, conf.agent_pod_prefix, conf.pod_name) == (
        "istio-system",
        "cni-",
        "",
    )


AGENT_POD_CASES = {
    "daemonset-pod": ("istio-system", "cni-abc12", True),
    "other-namespace": ("default", "cni-abc12", False),
    "suffix-too-short": ("istio-system", "cni-abc1", False),
    "suffix-too-long": ("istio-system", "cni-abc123", False),
    "suffix-upper-case": ("istio-system", "cni-ABC12", False),
    "suffix-with-dash": ("istio-system", "cni-ab-12", False),
    "other-prefix": ("istio-system", "cnx-abc12", False),
    "prefix-only": ("istio-system", "cni-", False),
    "longer-name-same-start": ("istio-system", "cni-extra-abc12", False),
}


@pytest.mark.parametrize(
    ("namespace", "name", "expected"), AGENT_POD_CASES.values(), ids=AGENT_POD_CASES.keys()
)
def test_agent_pods_are_the_namespace_plus_prefix_plus_five(
    namespace: str, name: str, expected: bool
) -> None:
    entry = standalone_entry(
        Settings(daemonSetName="cni"), pod_name="", pod_namespace="istio-system"
    )
    conf = parse(dumps(entry).encode(), command="ADD")
    assert is_agent_pod(conf, Pod(name, namespace, "uid")) is expected


def test_no_namespace_or_prefix_recognises_no_pod() -> None:
    for namespace, prefix in (("", "cni-"), ("istio-system", "")):
        entry = {
            "cniVersion": "1.0.0",
            "name": "n",
            "type": "istio-cni",
            "pod_namespace": namespace,
            "agent_pod_prefix": prefix,
        }
        conf = parse(dumps(entry).encode(), command="ADD")
        assert not is_agent_pod(conf, Pod("cni-abc12", namespace or "x", ""))


def test_an_entry_of_an_earlier_version_still_names_the_agent_pod() -> None:
    entry = {
        "cniVersion": "1.0.0",
        "name": "n",
        "type": "istio-cni",
        "pod_namespace": "istio-system",
        "pod_name": "istio-cni-node-abcde",
    }
    conf = parse(dumps(entry).encode(), command="ADD")
    assert is_agent_pod(conf, Pod("istio-cni-node-abcde", "istio-system", ""))
    assert not is_agent_pod(conf, Pod("istio-cni-node-bbbbb", "istio-system", ""))


@pytest.mark.parametrize("ambient", [False, True])
def test_the_plugin_learns_whether_ambient_is_on_and_gets_the_pods_annotations(
    ambient: bool,
) -> None:
    """What a plain pod needs to start while the agent is away (plugin/plain.py): the install's
    ambient switch, and the capability that makes the runtime hand the pod's annotations."""
    settings = Settings(ambient=AmbientSettings(enabled=ambient))
    entry = plugin_entry(settings, pod_name="", pod_namespace="ns")
    assert entry["capabilities"] == {"io.kubernetes.cri.pod-annotations": True}
    # libcni's injection of the capability's runtime argument into the entry it runs.
    given = {
        "cniVersion": "1.0.0",
        **entry,
        "runtimeConfig": {"io.kubernetes.cri.pod-annotations": {"a": "b"}},
    }
    conf = parse(dumps(given).encode(), command="ADD")
    assert conf.ambient_enabled is ambient
    assert conf.pod_annotations == {"a": "b"}
