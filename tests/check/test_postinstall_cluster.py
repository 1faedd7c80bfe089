"""`check` after install against the real API server: agent pods written as a DaemonSet's
(no kubelet, no DaemonSet controller here), each failure made to happen."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.check.conftest import Objects, run_check

pytestmark = pytest.mark.cluster


def test_no_daemonset_fails(kube_config: str, objects: Objects) -> None:
    ns = objects.namespace()
    code, checks, _ = run_check("-n", ns, "--kubeconfig", kube_config)
    assert code == 1
    assert checks["daemonset"]["status"] == "fail"
    assert "helm install" in checks["daemonset"]["fix"]


def test_an_agent_ready_on_every_node_passes(kube_config: str, objects: Objects) -> None:
    ns = objects.namespace({"pod-security.kubernetes.io/enforce": "privileged"})
    ds = objects.daemonset(ns)
    for suffix in ("a", "b"):
        objects.agent_pod(ds, objects.node(suffix))
    _code, checks, _text = run_check("-n", ns, "--kubeconfig", kube_config)
    for name in ("daemonset", "coverage", "agent-version", "readiness", "plugin-entry"):
        assert checks[name]["status"] == "pass", (name, checks[name])
    assert checks["coverage"]["message"].startswith("2 of 2 nodes")
    assert checks["plugin-entry"]["message"] == (
        "the plugin and its entry are in place on 2 of 2 nodes"
    )
    assert checks["pod-security"]["status"] == "pass"


def test_nodes_without_an_agent_are_named_with_why(kube_config: str, objects: Objects) -> None:
    ns = objects.namespace()
    ds = objects.daemonset(
        ns, tolerations=[{"key": "node.kubernetes.io/not-ready", "operator": "Exists"}]
    )
    served = objects.node("a")
    objects.agent_pod(ds, served)
    missing = objects.node("b")
    waiting = objects.node("c")
    objects.agent_pod(ds, waiting, scheduled=False)
    tainted = objects.node(
        "d", taints=[{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]
    )
    code, checks, _text = run_check("-n", ns, "--kubeconfig", kube_config)
    assert code == 1
    check = checks["coverage"]
    assert check["status"] == "fail"
    assert check["message"].startswith("1 of 3 nodes")
    details = "\n".join(check["details"])
    assert f"{missing}: no agent pod: the DaemonSet has not made one" in details
    assert f"{waiting}: agent pod {ns}/" in details
    assert "not scheduled: 0/9 nodes are available: 1 Insufficient cpu." in details
    assert (
        f"{tainted}: no agent by design: taint dedicated=gpu:NoSchedule is not tolerated" in details
    )
    assert "describe daemonset istio-cni" in check["fix"]
    assert served not in details


def test_a_tainted_node_alone_is_a_warning(kube_config: str, objects: Objects) -> None:
    ns = objects.namespace()
    ds = objects.daemonset(ns, tolerations=[])
    objects.node("d", taints=[{"key": "dedicated", "value": "gpu", "effect": "NoExecute"}])
    _, checks, _ = run_check("-n", ns, "--kubeconfig", kube_config)
    assert checks["coverage"]["status"] == "warn"
    assert "toleration" in checks["coverage"]["fix"]
    del ds


def test_agents_on_two_images_warn(kube_config: str, objects: Objects) -> None:
    ns = objects.namespace()
    ds = objects.daemonset(ns, image="registry.invalid/istio-cni:2")
    new, old = objects.node("a"), objects.node("b")
    objects.agent_pod(ds, new, image="registry.invalid/istio-cni:2")
    objects.agent_pod(ds, old, image="registry.invalid/istio-cni:1")
    _code, checks, _ = run_check("-n", ns, "--kubeconfig", kube_config)
    check = checks["agent-version"]
    assert check["status"] == "warn"
    assert check["details"] == [
        f"registry.invalid/istio-cni:1: {old}",
        f"registry.invalid/istio-cni:2: {new}",
    ]
    assert "rollout status daemonset/istio-cni" in check["fix"]


def test_agents_not_ready_name_why(kube_config: str, objects: Objects) -> None:
    ns = objects.namespace()
    ds = objects.daemonset(ns)
    probe_failing, crashing = objects.node("a"), objects.node("b")
    pod = objects.agent_pod(ds, probe_failing, ready=False)
    objects.event(
        ns, "Pod", pod, reason="Unhealthy",
        message="Readiness probe failed: HTTP probe failed with statuscode: 503",
    )  # fmt: skip
    back_off = "back-off 40s restarting failed container"
    objects.agent_pod(
        ds, crashing, ready=False, waiting={"reason": "CrashLoopBackOff", "message": back_off}
    )
    code, checks, _text = run_check("-n", ns, "--kubeconfig", kube_config)
    assert code == 1
    check = checks["readiness"]
    assert check["status"] == "fail"
    assert check["message"].startswith("2 of 2 agents not Ready")
    details = "\n".join(check["details"])
    assert (
        f"{probe_failing}: {ns}/{pod}: Readiness probe failed: HTTP probe failed with " in details
    )
    assert f"{crashing}: {ns}/" in details and "CrashLoopBackOff: back-off 40s" in details
    # no kubelet serves the pod's port here: the fix says how to read its checks' names
    assert "readiness check fails" in check["fix"] and "/proxy/readyz" in check["fix"]
    assert checks["plugin-entry"]["status"] == "warn"
    assert f"{crashing}: not confirmed: its agent is not Ready" in checks["plugin-entry"]["details"]


def test_a_daemonset_that_cannot_make_pods_fails(kube_config: str, objects: Objects) -> None:
    ns = objects.namespace()
    objects.daemonset(ns)
    objects.event(
        ns, "DaemonSet", "istio-cni", reason="FailedCreate",
        message='pods "istio-cni-x" is forbidden: violates PodSecurity "baseline:latest": '
        "host namespaces (hostNetwork=true)",
    )  # fmt: skip
    code, checks, _ = run_check("-n", ns, "--kubeconfig", kube_config)
    assert code == 1
    assert checks["daemonset"]["status"] == "fail"
    assert checks["daemonset"]["fix"] == (
        f"kubectl label namespace {ns} pod-security.kubernetes.io/enforce=privileged --overwrite"
    )


def test_gke_without_the_quota_fails_once_installed(kube_config: str, objects: Objects) -> None:
    ns = objects.namespace()
    objects.daemonset(ns)
    objects.node("gke", labels={"cloud.google.com/gke-nodepool": "pool"})
    code, checks, _ = run_check("-n", ns, "--kubeconfig", kube_config)
    assert checks["priority-quota"]["status"] == "fail"
    assert code == 1


def test_what_agents_published_about_pods(
    kube_config: str, kube_core: Any, objects: Objects
) -> None:
    ns, app_ns = objects.namespace(), objects.namespace()
    ds = objects.daemonset(ns)
    node = objects.node("a")
    agent = objects.agent_pod(ds, node)
    refused = kube_core.create_namespaced_pod(
        app_ns,
        {
            "metadata": {"name": "refused"},
            "spec": {
                "nodeName": node,
                "containers": [{"name": "app", "image": "registry.invalid/app:1"}],
            },
        },
    )
    broken = kube_core.create_namespaced_pod(
        app_ns,
        {
            "metadata": {"name": "broken"},
            "spec": {
                "nodeName": node,
                "containers": [{"name": "app", "image": "registry.invalid/app:1"}],
            },
        },
    )
    objects.event(
        app_ns,
        "Pod",
        "refused",
        reason="RedirectRefused",
        host=node,
        uid=refused.metadata.uid,
        message="this node's istio-cni agent refused the pod's network set-up (CNI ADD)",
    )
    objects.event(
        app_ns,
        "Pod",
        "broken",
        reason="RepairBrokenPod",
        host=node,
        uid=broken.metadata.uid,
        message="pod started without traffic redirect; repair-in-place failed: netns gone",
    )
    objects.event(
        app_ns,
        "Pod",
        "gone",
        reason="RedirectRefused",
        host=node,
        message="refused a pod since deleted",
    )
    objects.event(
        ns,
        "Pod",
        agent,
        reason="CNIConfigConflict",
        host=node,
        message="10-calico.conflist lost istio-cni's entry 5 times in the last minute",
    )
    code, checks, _ = run_check("-n", ns, "--kubeconfig", kube_config)
    assert code == 1
    check = checks["pods"]
    assert check["status"] == "fail"
    details = "\n".join(check["details"])
    assert f"{node}: {app_ns}/refused: refused 3 times, now Pending" in details
    assert (
        f"{node}: {app_ns}/broken: RepairBrokenPod: pod started without traffic redirect; "
        "repair-in-place failed: netns gone" in details
    )
    assert f"{app_ns}/gone" not in details  # deleted since: nothing to do
    entry = checks["plugin-entry"]
    assert entry["status"] == "warn"
    assert entry["details"] == [
        f"{node}: 10-calico.conflist lost istio-cni's entry 5 times in the last minute"
    ]


def test_rules_that_differ_warn(kube_config: str, kube_core: Any, objects: Objects) -> None:
    ns = objects.namespace()
    objects.event(
        ns,
        "Pod",
        "old-rules",
        reason="RedirectRulesDiffer",
        host="node-x",
        message="redirect rules in the pod differ",
    )
    _, checks, _ = run_check("--kubeconfig", kube_config)
    assert checks["pods"]["status"] == "warn"
    assert (
        f"node-x: {ns}/old-rules: rules differ from this release's (restart the pod)"
        in checks["pods"]["details"]
    )


def test_ambient_pods_waiting_for_ztunnel_warn(
    kube_config: str, kube_core: Any, objects: Objects
) -> None:
    labelled, plain = objects.namespace({"istio.io/dataplane-mode": "ambient"}), objects.namespace()
    node = objects.node("a")
    made = [
        (labelled, "waiting", {}, "pending"),
        (labelled, "enrolled", {}, "enabled"),
        (plain, "own-label", {"istio.io/dataplane-mode": "ambient"}, "pending"),
        (plain, "not-ambient", {}, "pending"),
    ]
    for ns, name, labels, state in made:
        kube_core.create_namespaced_pod(
            ns,
            {
                "metadata": {"name": name, "labels": labels},
                "spec": {"nodeName": node, "containers": [{"name": "a", "image": "x.invalid/a"}]},
            },
        )
        status = {"metadata": {"annotations": {"ambient.istio.io/redirection": state}},
                  "status": {"phase": "Running"}}  # fmt: skip
        kube_core.patch_namespaced_pod_status(name, ns, status)
    _, checks, _ = run_check("--kubeconfig", kube_config)
    check = checks["ambient"]
    assert check["status"] == "warn"
    assert check["details"] == [f"{node}: {labelled}/waiting", f"{node}: {plain}/own-label"]
    assert "ztunnel" in check["fix"]


def test_unreachable_cluster_exits_2(tmp_path: Path, control_plane: Any) -> None:
    config = (
        Path(control_plane.kubeconfig)
        .read_text()
        .replace(control_plane.server, "https://127.0.0.1:1")
    )
    path = tmp_path / "kubeconfig"
    path.write_text(config)
    code, checks, _ = run_check("--kubeconfig", str(path))
    assert (code, checks) == (2, {})


def test_a_user_who_may_read_nothing_exits_2(
    kube_core: Any, objects: Objects, make_identity: Any
) -> None:
    ns = objects.namespace()
    kube_core.create_namespaced_service_account(ns, {"metadata": {"name": "nobody"}})
    nobody = make_identity(ns, "nobody")
    for args in (["--pre", "-n", ns], []):
        code, checks, _ = run_check(*args, "--kubeconfig", str(nobody.kubeconfig))
        assert code == 2
        assert checks.pop("kubernetes-version")["status"] == "pass"  # anyone may read /version
        for check in checks.values():
            assert check["status"] == "warn"
            assert check["message"].startswith("could not check: GET /")
            assert "answered 403" in check["message"]
            assert "cluster admin" in check["fix"]


def test_the_kubectl_plugin_runs_the_check(kube_config: str, objects: Objects) -> None:
    ns = objects.namespace({"pod-security.kubernetes.io/enforce": "baseline"})
    script = Path(sys.executable).parent / "kubectl-istio_cni"
    done = subprocess.run(
        [str(script), "check", "--pre", "-n", ns, "--kubeconfig", kube_config],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "FAIL  pod-security" in done.stdout
    agent = Path(sys.executable).parent / "istio-cni-agent"
    done = subprocess.run(
        [str(agent), "check", "--pre", "-n", ns, "--kubeconfig", kube_config, "--json"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 1 and '"name": "pod-security"' in done.stdout
