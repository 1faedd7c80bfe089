"""Istio's installer test data (tests/testdata/istio-conformance/install/cases.json), reproduced.

Istio's plugin entry carries Istio's fields and ours carries ours, so expected files are Istio's
goldens with the istio-cni entry replaced by ours. One documented difference: a single-plugin .conf
wrapped into a list keeps its own network name and cniVersion (Istio writes "k8s-pod-network" and
"0.3.1"): host-local IPAM keys its leases by the network name, so renaming the network would hand
out addresses already in use. Comparison is as JSON (we keep the input's key order; Istio sorts).
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import threading
from typing import Any

import pytest

from agent.config import Settings
from agent.errors import InstallError, TransientInstallError
from agent.install import conflist
from agent.install.entry import plugin_entry, standalone_entry
from agent.install.installer import Installer
from agent.install.waiting import wait_installed
from testbed.agent_host import Node
from tests.install.conftest import conformance_dir

CASES_DIR = conformance_dir() / "install"
CASES = json.loads((CASES_DIR / "cases.json").read_text())
POD_NAME = "istio-cni-node-abc"
OWNED_NAME = "02-istio-conf.conflist"


def _json(name: str) -> Any:
    return json.loads((CASES_DIR / name).read_text())


def _with_our_entry(config: dict[str, Any], entry: dict[str, Any]) -> dict[str, Any]:
    plugins = [p for p in config["plugins"] if p.get("type") != "istio-cni"]
    return {**config, "plugins": [*plugins, {k: v for k, v in entry.items() if k != "cniVersion"}]}


# -- TestInsertCNIConfig: the pure merge ---------------------------------------------------------


@pytest.mark.parametrize("case", CASES["TestInsertCNIConfig"], ids=lambda c: c["subtest"])
def test_insert_cni_config(case: dict[str, Any]) -> None:
    existing, new = _json(case["existing"]), _json(case["new"])
    if case["expect_error"]:
        with pytest.raises(InstallError):
            conflist.insert(existing, new, source=case["existing"])
        return
    expected = _json(case["expected"])
    if conflist.is_single(existing):  # our documented difference: the network keeps its identity
        expected["name"], expected["cniVersion"] = existing["name"], existing["cniVersion"]
    assert conflist.insert(existing, new) == expected


# -- TestCreateCNIConfigFile: which file is written, and what it holds ----------------------------


def _case_settings(node: Node, case: dict[str, Any]) -> Settings:
    owned = case["IstioOwnedCNIConfig"]
    return node.with_settings(
        chained=case["ChainedCNIPlugin"],
        cniConfFileName=case["CNIConfName"],
        istioOwnedCNIConfig=owned,
        istioOwnedCNIConfigFileName=case["IstioOwnedCNIConfigFilename"] or OWNED_NAME,
        logLevel="debug",
        cniAgentRunDir="/path/to/kubeconfig",
        excludeNamespaces=(),
    )


def _expected_file(case: dict[str, Any], settings: Settings) -> dict[str, Any]:
    golden = _json(case["expected_golden"])
    if not settings.chained:
        assert conflist.is_single(golden) and golden["type"] == "istio-cni"
        return standalone_entry(settings, pod_name=POD_NAME, pod_namespace="my-namespace")
    entry = plugin_entry(settings, pod_name=POD_NAME, pod_namespace="my-namespace")
    expected = _with_our_entry(golden, entry)
    primary_sources = [
        src for src, name in case["existing_files"].items() if conflist.is_single(_json(src))
    ]
    if golden["name"] == conflist.WRAPPED_LIST_NAME and primary_sources:
        source = _json(primary_sources[0])  # the wrapped .conf keeps its name and cniVersion
        expected["name"], expected["cniVersion"] = source["name"], source["cniVersion"]
    return expected


@pytest.mark.parametrize(
    "case", CASES["TestCreateCNIConfigFile"]["cases"], ids=lambda c: c["subtest"]
)
def test_create_cni_config_file(node: Node, case: dict[str, Any]) -> None:
    settings = _case_settings(node, case)
    for src, name in case["existing_files"].items():
        shutil.copy(CASES_DIR / src, node.conf_dir / name)
    before = {p.name: p.read_bytes() for p in node.conf_dir.iterdir()}
    installer = Installer(settings, pod_name=POD_NAME, pod_namespace="my-namespace")
    if case["expect_timeout"]:
        with pytest.raises(TransientInstallError):
            wait_installed(installer, timeout=0.1, stop=threading.Event())
        assert {p.name: p.read_bytes() for p in node.conf_dir.iterdir()} == before
        assert installer.problems()
        return
    for _ in range(2):  # Istio runs each case twice; the second run changes nothing
        installer.install()
    assert installer.problems() == []
    written = case["expected_written_file"]
    expected = _expected_file(case, settings)
    sources = [n for n in before if conflist.list_file_name(n) == written and n != written]
    if settings.chained and not settings.istioOwnedCNIConfig and sources:
        # Ours: the list made from a .conf keeps its text, so uninstall can give it back.
        expected = conflist.with_converted_from(expected, sources[0], before[sources[0]].decode())
    if settings.istioOwnedCNIConfig:
        # Ours: the owned copy names the primary it copies, which marks it as ours whole.
        primary = node.conf(written).get(conflist.OWNED_COPY_KEY)
        assert primary in before and primary != written
        expected = conflist.with_owned_copy_of(expected, primary)
    assert node.conf(written) == expected
    files = {p.name for p in node.conf_dir.iterdir()}
    if settings.istioOwnedCNIConfig:
        # The primary is only read: every existing file is left as it was.
        assert {n: (node.conf_dir / n).read_bytes() for n in before} == before
        assert files == set(before) | {written}
    elif written not in before and settings.chained:
        converted = next(n for n in before if conflist.list_file_name(n) == written)
        assert converted not in files and files == (set(before) - {converted}) | {written}


# -- TestCleanup ---------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES["TestCleanup"], ids=lambda c: c["subtest"])
def test_cleanup(node: Node, case: dict[str, Any]) -> None:
    target = node.conf_dir / case["copied_as"]
    shutil.copy(CASES_DIR / case["input"], target)
    settings = node.with_settings(
        chained=case["ChainedCNIPlugin"],
        istioOwnedCNIConfig=case["IstioOwnedCNIConfig"],
        istioOwnedCNIConfigFileName=(
            case["copied_as"] if case["IstioOwnedCNIConfig"] else OWNED_NAME
        ),
        cniConfFileName="" if case["ChainedCNIPlugin"] else case["copied_as"],
    )
    Installer(settings, pod_name=POD_NAME, pod_namespace="my-namespace").uninstall()
    if case["expect_deleted"]:
        assert not target.exists()
    else:
        assert json.loads(target.read_text()) == _json(case["expected"])


# -- TestCheckInstall cases whose meaning is the same for us --------------------------------------


def _place(node: Node, src: str, name: str, entry: dict[str, Any]) -> None:
    data = _json(src)
    if "plugins" in data and conflist.count_ours(data):
        data = _with_our_entry(data, entry)
    (node.conf_dir / name).write_text(json.dumps(data))


CHECK_CASES = [
    # (id, valid, chained, CNIConfName, files {src: name}, owned file name or "")
    (
        "preempted config",
        False,
        True,
        "",
        {"bridge.conf": "bridge.conf", "list.conflist.golden": "list.conflist"},
        "",
    ),
    (
        "intentional preempted config invalid",
        False,
        True,
        "invalid-arr.conflist",
        {"bridge.conf": "bridge.conf", "invalid-arr.conflist": "invalid-arr.conflist"},
        "",
    ),
    (
        "intentional preempted config, missing istio owned config",
        False,
        True,
        "list.conflist",
        {"bridge.conf": "bridge.conf", "list.conflist.golden": "list.conflist"},
        OWNED_NAME,
    ),
    (
        "intentional preempted config",
        True,
        True,
        "list.conflist",
        {"bridge.conf": "bridge.conf", "list.conflist.golden": "list.conflist"},
        "",
    ),
    ("CNI config file removed", False, False, "", {}, ""),
    (
        "istio-cni config removed from CNI config file",
        False,
        True,
        "",
        {"list.conflist": "list.conflist"},
        "",
    ),
    ("chained CNI plugin", True, True, "", {"list.conflist.golden": "list.conflist"}, ""),
    (
        "standalone CNI plugin istio-cni config not in CNI config file",
        False,
        False,
        "",
        {"bridge.conf": "bridge.conf"},
        "",
    ),
]


@pytest.mark.parametrize("case", CHECK_CASES, ids=lambda c: c[0])
def test_check_install(node: Node, case: tuple[Any, ...]) -> None:
    _id, valid, chained, name, files, owned = case
    settings = node.with_settings(
        chained=chained,
        cniConfFileName=name,
        istioOwnedCNIConfig=bool(owned),
        istioOwnedCNIConfigFileName=owned or OWNED_NAME,
    )
    installer = Installer(settings, pod_name=POD_NAME, pod_namespace="my-namespace")
    for src, dst in files.items():
        _place(node, src, dst, installer.entry)
    shutil.copy(node.src_dir / "istio-cni", node.bin_dir / "istio-cni")
    before = {p.name: p.read_bytes() for p in node.conf_dir.iterdir()}
    assert (installer.problems() == []) is valid
    assert {p.name: p.read_bytes() for p in node.conf_dir.iterdir()} == before  # check only


def test_standalone_check_valid(node: Node) -> None:
    settings = node.with_settings(chained=False, cniConfFileName="istio-cni.conf")
    installer = Installer(settings, pod_name=POD_NAME, pod_namespace="ns")
    (node.conf_dir / "istio-cni.conf").write_text(json.dumps(installer.entry))
    os.chmod(node.conf_dir / "istio-cni.conf", 0o644)
    shutil.copy(node.src_dir / "istio-cni", node.bin_dir / "istio-cni")
    # Beyond Istio's check: a file of ours must also have our mode (Istio's CNIConfFileMode).
    assert installer.problems() == [f"{node.conf_dir / 'istio-cni.conf'}: mode 0644, want 0600"]
    os.chmod(node.conf_dir / "istio-cni.conf", 0o600)
    assert installer.problems() == []


def test_conformance_dir_is_the_projects_copy() -> None:
    assert (CASES_DIR / "CASES.md").is_file()
    assert pathlib.Path(CASES_DIR).name == "install"
