"""The check's logic without a cluster: what it shares with the chart and the agent, the
scheduling and version rules, /readyz's names, the output and the exit codes."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.check import agents, cli, platform, published, result, scheduling
from agent.check.cluster import ReadError, Unreachable
from agent.check.facts import AGENT_CONTAINER, AGENT_SELECTOR, Facts

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "istio-cni"


class FakeCluster:
    """Answers by path (lists by path and query), the pod proxy by path."""

    def __init__(self, objects: dict[str, Any] | None = None) -> None:
        self.objects = objects or {}
        self.proxied: list[str] = []
        self.proxy: dict[str, tuple[int, str]] = {}

    def get(self, path: str, **query: str) -> dict[str, Any] | None:
        found = self.objects.get(path)
        if isinstance(found, Exception):
            raise found
        return found

    def items(self, path: str, **query: str) -> list[dict[str, Any]]:
        key = path + "?" + "&".join(f"{k}={v}" for k, v in sorted(query.items()))
        found = self.objects.get(key, self.objects.get(path + "?", []))
        if isinstance(found, Exception):
            raise found
        return list(found)

    def proxy_text(self, path: str) -> tuple[int, str]:
        self.proxied.append(path)
        if path not in self.proxy:
            raise ReadError("dial tcp: connection refused")
        return self.proxy[path]


# -- what the check shares with the chart and the agent ------------------------------------


def test_the_charts_kube_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == platform.CHART_KUBE_VERSION


def test_the_charts_names() -> None:
    helpers = (CHART / "templates" / "_helpers.tpl").read_text()
    assert AGENT_SELECTOR.replace("=", ": ") in helpers
    daemonset = (CHART / "templates" / "daemonset.yaml").read_text()
    assert f"- name: {AGENT_CONTAINER}\n" in daemonset
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["metricsPort"] == agents.DEFAULT_PORT
    assert values["priorityClassName"] == platform.PRIORITY_CLASS


def test_the_agents_event_reasons() -> None:
    from agent.podserver.handlers import REFUSED_EVENT
    from agent.repair import service
    from agent.wiring import CONFLICT_EVENT

    assert published.REFUSED == REFUSED_EVENT
    assert published.RULES_DIFFER == service.RULES_DIFFER_REASON
    assert set(published.REPAIRS) == set(service._REASON.values())
    assert published.CONFLICT == CONFLICT_EVENT


def test_the_agents_ambient_names() -> None:
    from agent.ambient.enrollment import REDIRECTION_ANNOTATION
    from agent.check import ambient
    from agent.label_selectors import DATAPLANE_MODE_LABEL

    assert ambient.REDIRECTION == REDIRECTION_ANNOTATION
    assert ambient.MODE_LABEL == DATAPLANE_MODE_LABEL


def test_the_readiness_checks_have_fixes() -> None:
    from agent.check.postinstall import CHECK_FIXES

    doc = (ROOT / "agent" / "readiness" / "build.py").read_text().split('"""')[1]
    names = {line.split()[0] for line in doc.splitlines()[3:] if line.startswith("    ")}
    assert names == set(CHECK_FIXES)


# -- versions and scheduling ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "constraint", "ok"),
    [
        ("v1.29.0", ">=1.29.0-0", True),
        ("v1.29.3-gke.1093000", ">=1.29.0-0", True),
        ("v1.28.15", ">=1.29.0-0", False),
        ("v1.35.4", ">=1.29.0-0 <1.36", True),
        ("v1.36.0", ">=1.29.0-0, <1.36", False),
        ("v1.30+k3s1", ">=1.29.0-0", True),
    ],
)
def test_versions(version: str, constraint: str, ok: bool) -> None:
    parsed = platform.parse_version(version)
    assert parsed is not None
    assert platform.satisfies(parsed, constraint) is ok


def _node(labels: dict[str, str] | None = None, taints: list[dict[str, str]] | None = None) -> Any:
    return {"metadata": {"name": "n1", "labels": labels or {}}, "spec": {"taints": taints or []}}


GPU = {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}
NET = {"key": "node.kubernetes.io/network-unavailable", "effect": "NoSchedule"}
CORDONED = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}


def _required(*terms: Any) -> dict[str, Any]:
    required = {"nodeSelectorTerms": list(terms)}
    return {
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}
    }


def _expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": operator, "values": list(values)}


@pytest.mark.parametrize(
    ("spec", "node", "kind"),
    [
        ({}, _node(), None),
        ({"nodeSelector": {"os": "linux"}}, _node({"os": "windows"}), "selector"),
        ({}, _node(taints=[GPU]), "taint"),
        ({}, _node(taints=[{**GPU, "effect": "PreferNoSchedule"}]), None),
        ({"tolerations": [{"operator": "Exists"}]}, _node(taints=[GPU]), None),
        ({"tolerations": [{"key": "dedicated", "value": "gpu"}]}, _node(taints=[GPU]), None),
        ({"tolerations": [{"key": "dedicated", "value": "cpu"}]}, _node(taints=[GPU]), "taint"),
        ({"tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoExecute"}]},
         _node(taints=[GPU]), "taint"),
        ({}, _node(taints=[CORDONED]), None),
        ({}, _node(taints=[NET]), "taint"),
        ({"hostNetwork": True}, _node(taints=[NET]), None),
        (_required({"matchExpressions": [_expr("pool", "In", "a")]},
                   {"matchFields": [_expr("metadata.name", "In", "n1")]}), _node(), None),
        (_required({"matchExpressions": [_expr("cores", "Gt", "8")]}), _node({"cores": "4"}),
         "selector"),
        (_required({"matchExpressions": [_expr("spot", "DoesNotExist")]}),
         _node({"spot": "true"}), "selector"),
    ],
    ids=[
        "plain", "os-selector", "taint", "prefer-no-schedule", "tolerate-all", "tolerate-equal",
        "other-value", "other-effect", "cordoned", "network-unavailable", "host-network",
        "affinity-fields", "affinity-gt", "affinity-does-not-exist",
    ],
)  # fmt: skip
def test_which_nodes_a_daemonset_runs_on(spec: Any, node: Any, kind: str | None) -> None:
    found = scheduling.excluded(spec, node)
    assert (found.kind if found else None) == kind


# -- /readyz through the API server -------------------------------------------------------

CONTAINER = {
    "name": AGENT_CONTAINER,
    "ports": [{"name": "metrics", "containerPort": 15099}],
    "readinessProbe": {"httpGet": {"path": "/readyz", "port": "metrics"}},
}
POD = {
    "metadata": {"name": "istio-cni-x", "namespace": "kube-system"},
    "spec": {"containers": [CONTAINER]},
}
READYZ = "/api/v1/namespaces/kube-system/pods/istio-cni-x:15099/proxy/readyz"


def test_readyz_names_the_failing_checks() -> None:
    cluster = FakeCluster()
    cluster.proxy[READYZ] = (503, "not ready: install, rules\ninstall: no entry in 10-x.conflist\n"
                                  "rules: nft: Operation not permitted\n")  # fmt: skip
    assert agents.read_readyz(Facts(cluster, None), POD) == {
        "install": "no entry in 10-x.conflist",
        "rules": "nft: Operation not permitted",
    }
    cluster.proxy[READYZ] = (200, "ready\n")
    assert agents.read_readyz(Facts(cluster, None), POD) == {}


def test_readyz_out_of_reach_is_tried_once_per_run() -> None:
    cluster = FakeCluster()
    facts = Facts(cluster, None)
    assert agents.read_readyz(facts, POD) is None
    assert agents.read_readyz(facts, POD) is None
    assert cluster.proxied == [READYZ]
    cluster.proxy[READYZ] = (503, '{"kind":"Status","message":"error trying to reach service"}')
    assert agents.read_readyz(Facts(cluster, None), POD) is None


# -- a run on a fake cluster: readiness by check name, the version, exit codes --------------


def _installed(
    proxy: tuple[int, str], version: str = "v1.35.4", ready: str = "False"
) -> FakeCluster:
    template = {"metadata": {"labels": {"app": "a"}}, "spec": POD["spec"]}
    ds = {
        "metadata": {"name": "istio-cni", "namespace": "kube-system"},
        "spec": {"selector": {"matchLabels": {"app": "a"}}, "template": template},
    }
    pod = json.loads(json.dumps(POD))
    pod["spec"]["nodeName"] = "n1"
    pod["status"] = {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": ready}],
        "containerStatuses": [{"name": AGENT_CONTAINER, "started": True, "state": {"running": {}}}],
    }
    cluster = FakeCluster({
        "/version": {"gitVersion": version},
        f"/apis/apps/v1/daemonsets?labelSelector={AGENT_SELECTOR}": [ds],
        "/api/v1/namespaces/kube-system/pods?labelSelector=app=a": [pod],
        "/api/v1/nodes?": [{"metadata": {"name": "n1", "labels": {}},
                            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}],
        "/api/v1/namespaces/kube-system": {"metadata": {"name": "kube-system"}},
    })  # fmt: skip
    cluster.proxy[READYZ] = proxy
    return cluster


def test_an_agent_not_ready_is_named_with_its_failing_checks() -> None:
    body = "not ready: install\ninstall: istio-cni missing from /host/opt/cni/bin\n"
    cluster = _installed((503, body), version="v1.28.2")
    out = io.StringIO()
    assert cli.main("check", ["--json"], cluster=cluster, out=out) == cli.FAILED
    checks = {c["name"]: c for c in json.loads(out.getvalue())}
    assert checks["readiness"]["details"] == [
        "n1: kube-system/istio-cni-x: readiness check install fails: istio-cni missing from "
        "/host/opt/cni/bin"
    ]
    assert checks["readiness"]["fix"].startswith("install: the agent's log names the missing file")
    assert checks["plugin-entry"]["status"] == "fail"
    assert checks["plugin-entry"]["details"] == ["n1: istio-cni missing from /host/opt/cni/bin"]
    assert checks["kubernetes-version"]["status"] == "fail"
    assert checks["istiod-cni"]["status"] == "warn"


def test_a_forbidden_read_warns_that_check_only() -> None:
    cluster = _installed((200, "ready\n"), ready="True")
    cluster.objects["/api/v1/configmaps?fieldSelector=metadata.name=cilium-config"] = ReadError(
        "GET /api/v1/configmaps: API server answered 403: forbidden", 403
    )
    out = io.StringIO()
    assert cli.main("check", ["--json"], cluster=cluster, out=out) == cli.OK
    checks = {c["name"]: c for c in json.loads(out.getvalue())}
    assert checks["cilium-exclusive"]["status"] == "warn"
    assert "cluster admin" in checks["cilium-exclusive"]["fix"]
    assert checks["readiness"]["status"] == "pass"


def test_usage_and_an_unreachable_cluster_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main("check", ["--bogus"]) == cli.USAGE
    assert cli.main("check", ["--help"]) == cli.OK
    down = FakeCluster({"/version": Unreachable("no answer from the API server: refused")})
    assert cli.main("check", [], cluster=down) == cli.USAGE
    assert "cannot reach the cluster: no answer" in capsys.readouterr().err
    assert cli.kubectl_main([]) == cli.USAGE
    assert cli.kubectl_main(["status"]) == cli.USAGE
    assert cli.kubectl_main(["--help"]) == cli.OK


def test_text_output_is_one_line_per_check_with_its_fix() -> None:
    results = [
        result.passed("a", "fine"),
        result.failure("bb", "broken\x1b[31m", "do this", [f"node-{i}" for i in range(25)]),
    ]
    text = result.text(results).splitlines()
    assert text[0] == "PASS  a   fine"
    assert text[1] == "FAIL  bb  broken\\x1b[31m"
    assert text[2:4] == ["      - node-0", "      - node-1"]
    assert text[22] == "      ... 5 more (--json lists all)"
    assert text[23] == "      fix: do this"
    assert text[24] == "1 passed, 0 warnings, 1 failures"
