"""What a release carries besides the templates: `helm show values` shows the defaults, Chart.yaml
names home, sources, maintainers, icon, licence, the default image and this version's changes
(Artifact Hub's annotations), and those agree with CHANGELOG.md, LICENSE and pyproject.toml."""

from __future__ import annotations

import re
import tomllib
from typing import Any

import pytest
import yaml

from testbed.helm import CHART, Helm
from testbed.parts import REPO_ROOT
from tests.chart.conftest import agent_container

pytestmark = pytest.mark.chart

HOME = "https://github.com/istio-cni/istio-cni"
CHANGE_KINDS = {"added", "changed", "deprecated", "removed", "fixed", "security"}


def chart() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((CHART / "Chart.yaml").read_text())
    return data


def annotation(name: str) -> Any:
    return yaml.safe_load(chart()["annotations"][f"artifacthub.io/{name}"])


def changelog_section(version: str) -> str:
    text = (REPO_ROOT / "CHANGELOG.md").read_text()
    match = re.search(rf"^## \[{re.escape(version)}\][^\n]*\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"CHANGELOG.md has no section ## [{version}]"
    return match[1]


def test_helm_show_values_shows_the_defaults(helm: Helm) -> None:
    shown = helm.run("show", "values", str(CHART))
    assert shown.rstrip("\n") == (CHART / "values.yaml").read_text().rstrip("\n")
    values = yaml.safe_load(shown)
    assert values["cniBinDir"] == "/opt/cni/bin"
    assert values["repair"]["mode"] == "repair-in-place"
    assert values["tolerations"] == [{"operator": "Exists"}]


def test_chart_names_its_home_sources_maintainers_and_icon(helm: Helm) -> None:
    shown = yaml.safe_load(helm.run("show", "chart", str(CHART)))
    assert shown["home"] == HOME
    assert shown["sources"] == [HOME]
    assert shown["maintainers"] and all(
        m["name"] and m["url"] == HOME for m in shown["maintainers"]
    )
    prefix = "https://raw.githubusercontent.com/istio-cni/istio-cni/main/"
    assert shown["icon"].startswith(prefix)
    icon = REPO_ROOT / shown["icon"].removeprefix(prefix)
    assert icon.is_file() and icon.read_text().lstrip().startswith("<svg")
    helm.run("lint", "--strict", str(CHART))


def test_default_image_is_the_annotated_one_at_the_app_version(helm: Helm) -> None:
    (image,) = annotation("images")
    assert image["image"] == f"ghcr.io/istio-cni/istio-cni:{chart()['appVersion']}"
    assert agent_container(helm.render())["image"] == image["image"]


def test_versions_agree_with_the_package() -> None:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert chart()["appVersion"] == project["version"]
    assert annotation("license") == project["license"]["text"] == "Apache-2.0"
    license_text = (REPO_ROOT / "LICENSE").read_text()
    assert license_text.lstrip().startswith("Apache License\n")
    assert (
        "Version 2.0, January 2004" in license_text
        and "END OF TERMS AND CONDITIONS" in license_text
    )


def test_changes_are_this_versions_changelog_entries() -> None:
    changes = annotation("changes")
    section = changelog_section(chart()["version"])
    assert changes, "artifacthub.io/changes is empty"
    for change in changes:
        assert change["kind"] in CHANGE_KINDS, change
        heading = {"added": "Added", "changed": "Changed", "fixed": "Fixed"}.get(change["kind"])
        assert heading is None or f"### {heading}" in section
        assert change["description"] in section, f"not in CHANGELOG.md: {change['description']}"
    assert "### Upgrade notes" in section
    assert re.search(r"^## \[Unreleased\]", (REPO_ROOT / "CHANGELOG.md").read_text(), re.M)


def test_links_point_at_files_of_the_repository() -> None:
    for link in annotation("links"):
        assert link["url"].startswith(HOME), link
        if "/blob/main/" in link["url"]:
            assert (REPO_ROOT / link["url"].split("/blob/main/", 1)[1]).is_file(), link


def test_versioning_policy_is_in_the_chart_readme() -> None:
    readme = (CHART / "README.md").read_text()
    assert "## Versions" in readme and "appVersion" in readme and "chart version" in readme.lower()
