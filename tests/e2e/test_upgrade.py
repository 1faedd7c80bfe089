"""helm upgrade with changed values: the old agent, on SIGTERM, keeps the plugin (its DaemonSet is
still there); pods created while no agent runs wait (ADD fails with "try again later") and none
starts uncaptured; the new agent picks up the new config.yaml; the node's conflist keeps our entry
at every moment."""

from __future__ import annotations

import json
import secrets
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testbed import kubepods
from testbed.cni import CniNode
from testbed.helm import Helm
from testbed.node import NodePods
from testbed.podnet import call_plugin, connect, has_istio_rules, proxy_in
from testbed.wait import wait_for
from tests.e2e.harness import ChartOnNode, helm_binary

pytestmark = [pytest.mark.e2e, pytest.mark.chart, pytest.mark.cluster, pytest.mark.netns]

NAMESPACE = "istio-cni-e2e"
SIDECAR = {
    "annotations": {"sidecar.istio.io/status": "{}"},
    "containers": [{"name": "app", "image": "app"}, {"name": "istio-proxy", "image": "proxy"}],
}
TRY_AGAIN_LATER = 11
PREV_RESULT = {"cniVersion": "1.0.0", "interfaces": [], "ips": []}


class ConflistWatch:
    """Reads the conflist continuously in a thread; remembers every read without our entry."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.reads = 0
        self.missing: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            text = self.path.read_text()
            self.reads += 1
            try:
                types = [p.get("type") for p in json.loads(text)["plugins"]]
            except (ValueError, KeyError) as e:
                self.missing.append(f"unreadable ({e}): {text[:200]}")
                continue
            if types.count("istio-cni") != 1:
                self.missing.append(text[:500])
            self._stop.wait(0.005)

    def __enter__(self) -> ConflistWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@pytest.fixture
def legacy_namespace(kube_core: Any) -> Iterator[str]:
    with kubepods.temporary_namespace(kube_core, f"legacy-{secrets.token_hex(3)}") as name:
        yield name


@pytest.mark.parametrize("helm_version", ["3", "4"], ids=["helm3", "helm4"])
def test_upgrade_keeps_the_entry_and_picks_up_the_new_config(
    helm_version: str,
    chart_on_node: ChartOnNode,
    helm_releases: Any,
    helm_binaries: dict[str, Any],
    cni_node: CniNode,
    node_pods: NodePods,
    kube_core: Any,
    legacy_namespace: str,
) -> None:
    helm: Helm = helm_releases(helm_binary(helm_binaries, helm_version))
    old = chart_on_node.install(helm, NAMESPACE)
    old_agent = chart_on_node.start_agent(old)
    old_agent.wait_ready()
    before = node_pods.create(legacy_namespace, "before", **SIDECAR)
    box = cni_node.new_sandbox("before", legacy_namespace, before["metadata"]["uid"])
    cni_node.add(box)
    assert has_istio_rules(box.netns_name), "not redirected before the upgrade"
    entry_before = _our_entry(cni_node)
    assert entry_before["plugin_log_level"] == "info"

    with ConflistWatch(cni_node.conflist_path) as watch:
        excludes = ["istio-system", "kube-system", legacy_namespace]
        new = chart_on_node.install(
            helm, NAMESPACE, {"logLevel": "debug", "excludeNamespaces": excludes}
        )
        # The DaemonSet controller replaces the pod: delete the old one, the kubelet sends
        # SIGTERM; the DaemonSet is still there, so this is an upgrade.
        kube_core.delete_namespaced_pod(old.agent_pod, NAMESPACE)
        assert old_agent.stop() == 0
        chart_on_node.release_agent_pod(NAMESPACE, old.agent_pod)
        assert "DaemonSet still runs on this node" in old_agent.logs()
        assert _our_entry(cni_node) == entry_before
        assert (cni_node.bin_dir / "istio-cni").is_file()

        # No agent: a sidecar pod's sandbox fails with "try again later" and gets no rules.
        waiting = node_pods.create("default", "waiting", **SIDECAR)
        first = cni_node.new_sandbox("waiting", "default", waiting["metadata"]["uid"])
        failed = cni_node.run("ADD", first, check=False)
        assert not failed.ok, failed
        assert "pluginevent.sock" in failed.stderr, failed
        assert not has_istio_rules(first.netns_name)
        # The error object the runtime gets from our plugin: code 11, "try again later".
        code, error = call_plugin(cni_node, first, "ADD", PREV_RESULT)
        assert (code, error.get("code")) == (1, TRY_AGAIN_LATER), error
        cni_node.delete(first)  # the runtime tears the failed sandbox down and retries
        cni_node.remove_sandbox(first)

        new_agent = chart_on_node.start_agent(new)
        new_agent.wait_ready()
        wait_for(
            lambda: _our_entry(cni_node)["plugin_log_level"] == "debug",
            "the entry to carry the new log level",
        )
    assert watch.reads > 10, watch.reads  # the watch did run through the restart
    assert watch.missing == [], f"our entry was missing from the conflist: {watch.missing[:3]}"
    entry = _our_entry(cni_node)
    assert entry["exclude_namespaces"] == excludes
    # Named by the DaemonSet, not the pod: the new agent pod matches the same entry.
    assert new.agent_pod.startswith(entry["agent_pod_prefix"])
    assert "level=debug" in new_agent.logs()

    # The retried sandbox is redirected.
    retry = cni_node.new_sandbox("waiting", "default", waiting["metadata"]["uid"])
    result = cni_node.add(retry)
    assert has_istio_rules(retry.netns_name)
    gateway = str(result["ips"][0]["gateway"])
    with proxy_in(retry):
        assert connect(retry.netns_name, gateway, 9) == f"outbound|{gateway}:9"

    # The newly excluded namespace is no longer redirected.
    after = node_pods.create(legacy_namespace, "after", **SIDECAR)
    skipped = cni_node.new_sandbox("after", legacy_namespace, after["metadata"]["uid"])
    cni_node.add(skipped)
    assert not has_istio_rules(skipped.netns_name)
    for sandbox in (box, retry, skipped):
        cni_node.delete(sandbox)
    assert new_agent.stop() == 0


def _our_entry(cni_node: CniNode) -> dict[str, Any]:
    plugins = json.loads(cni_node.conflist_path.read_text())["plugins"]
    ours = [p for p in plugins if p.get("type") == "istio-cni"]
    assert len(ours) == 1, plugins
    return dict(ours[0])
