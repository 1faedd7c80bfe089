"""The chart's alerts (files/alerts.yaml): valid for promtool, and unit-tested by promtool with
series that must fire each alert and series that must not (alerts_test.yaml). Each alert's test
is shown to bite: a copy of the rules with that alert loosened fails it."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.observability.promtool import ALERT_TESTS, ALERTS, promtool

pytestmark = pytest.mark.observability

ALERT_NAMES = (
    "IstioCniAgentDown",
    "IstioCniAgentsNotScraped",
    "IstioCniAgentUnavailable",
    "IstioCniInstallNotReady",
    "IstioCniReadinessCheckFailing",
    "IstioCniRulesApplyFailing",
    "IstioCniConfigConflict",
    "IstioCniPodsRefusedUndecided",
    "IstioCniRepairFailing",
    "IstioCniPodCacheStale",
    "IstioCniPluginSlow",
    "IstioCniAddSlow",
)

# Per alert, an edit of its expression that lets a series of its test which must not fire do so.
LOOSENED = {
    "IstioCniAgentDown": ("== 0", "<= 1"),
    "IstioCniAgentsNotScraped": ('job="istio-cni-node"', 'job="istio-cni-node",node="node-z"'),
    "IstioCniAgentUnavailable": ('created_by_name="istio-cni"', 'created_by_name=~".+"'),
    "IstioCniReadinessCheckFailing": ('{check!="install"}', ""),
    "IstioCniRulesApplyFailing": ("> 2", "> 0"),
    "IstioCniInstallNotReady": ("== 0", ">= 0"),
    "IstioCniConfigConflict": ("> 3", ">= 0"),
    "IstioCniPodsRefusedUndecided": (
        '{reason=~"lookup_failed|pod_not_found|decision_failed|ambient_detection_failed"}',
        "",
    ),
    "IstioCniRepairFailing": ('{result="fail"}', ""),
    "IstioCniPodCacheStale": ("> 600", "> -1"),
    "IstioCniPluginSlow": ("> 1", "> 0.01"),
    "IstioCniAddSlow": ("> 1", "> 0.01"),
}


def rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [r for g in groups for r in g["rules"]]


def test_promtool_check_rules_accepts_the_chart_alerts() -> None:
    done = promtool("check", "rules", str(ALERTS))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(ALERT_NAMES)} rules found" in done.stdout


def test_the_alerts_are_the_issue_list_each_with_a_runbook() -> None:
    """Each alert names where to look (node, namespace, pod: none is aggregated away) and links
    its runbook page (tests/observability/test_runbooks.py reads the pages)."""
    readme = (ALERTS.parents[1] / "README.md").read_text()
    section = readme.split("## Observability", 1)[1].split("\n## ", 1)[0]
    assert tuple(r["alert"] for r in rules()) == ALERT_NAMES
    for rule in rules():
        assert rule["labels"]["severity"] in ("warning", "critical")
        assert rule["annotations"]["runbook_url"].endswith(f"/docs/runbooks/{rule['alert']}.md")
        assert f"**{rule['alert']}**" in section
        expr = " ".join(rule["expr"].split())
        for by in re.findall(r"by \(([^)]*)\)", expr):
            labels = {label.strip() for label in by.split(",")}
            assert {"node", "namespace", "pod"} <= labels, f"{rule['alert']}: by ({by})"


def test_promtool_unit_tests_pass() -> None:
    done = promtool("test", "rules", ALERT_TESTS.name, cwd=ALERT_TESTS.parent)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_every_alert_has_a_firing_case_and_series_that_must_not_fire() -> None:
    tests = yaml.safe_load(ALERT_TESTS.read_text())["tests"]
    for name in ALERT_NAMES:
        cases = [
            (t, c) for t in tests for c in t.get("alert_rule_test", []) if c["alertname"] == name
        ]
        firing = [(t, c) for t, c in cases if c["exp_alerts"]]
        assert firing, f"{name}: no case where it fires"
        if name == "IstioCniAgentsNotScraped":  # absent(): its pending case is the other one
            assert any(not c["exp_alerts"] for _, c in cases), name
            continue
        for test, case in firing:
            fired = {a["exp_labels"]["pod"] for a in case["exp_alerts"]}
            fed = {s["series"].split('pod="')[1].split('"')[0] for s in test["input_series"]}
            assert fed - fired, f"{name}: every series of its test fires; none must not"


@pytest.mark.parametrize("alert", ALERT_NAMES)
def test_loosening_an_alert_fails_its_unit_test(alert: str, tmp_path: Path) -> None:
    """The must-not-fire series are checked: a looser expression makes promtool fail."""
    old, new = LOOSENED[alert]
    data = yaml.safe_load(ALERTS.read_text())
    changed = 0
    for rule in data["groups"][0]["rules"]:
        if rule["alert"] == alert:
            assert old in rule["expr"], f"{alert}: {old!r} not in its expression"
            rule["expr"] = rule["expr"].replace(old, new)
            changed += 1
    assert changed == 1
    rules_dir = tmp_path / "charts" / "istio-cni" / "files"
    rules_dir.mkdir(parents=True)
    (rules_dir / "alerts.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    tests_dir = tmp_path / "tests" / "observability"
    tests_dir.mkdir(parents=True)
    shutil.copy(ALERT_TESTS, tests_dir / ALERT_TESTS.name)
    done = promtool("test", "rules", ALERT_TESTS.name, cwd=tests_dir)
    assert done.returncode != 0, f"{alert} loosened and its unit test still passes"
    assert alert in done.stdout + done.stderr
