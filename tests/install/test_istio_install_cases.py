"""Istio's own installer test, its 16 cases run against our installer and watcher.

Each case as `cni/test/install_cni.go` runs it (tests/testdata/istio-install-test/ORIGIN.md): the
listed files copied in as `0<i>-<name>`, the watcher started with `cniConfFileName` = the case's
`preConfFile`, a delayed file copied in later (the watcher must wait for it), the result compared
with Istio's expected file, our entry removed (as Istio's test removes it: the file rewritten with
sorted keys) and the result compared again, then the watcher stopped and cleanup run.

Where we differ from Istio on purpose (also in the README, "Differences from Istio's installer"):
- the entry is ours (our plugin's fields), so files are compared with the istio-cni entry taken
  out of both sides;
- a single-plugin .conf turned into a list keeps its own network name (Istio: k8s-pod-network):
  host-local IPAM keys its leases by that name;
- that list carries the .conf's name and text (`istioCniConvertedFrom`), and cleanup gives the
  node its .conf back byte for byte and removes the list (Istio leaves the .conflist it made).
Everything else is compared byte for byte, as Istio's test does.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import time
from collections.abc import Iterator
from typing import Any

import pytest

from agent.install import conflist, jsontext
from agent.install.atomic import atomic_write, is_temp_name
from agent.install.installer import Installer
from agent.install.watcher import InstallWatcher, WatchTiming
from testbed.agent_host import Node
from testbed.wait import wait_for

DATA = pathlib.Path(__file__).resolve().parents[1] / "testdata" / "istio-install-test"
CASES = json.loads((DATA / "cases.json").read_text())["cases"]
POD = ("istio-cni-node-abc", "istio-system")


def test_all_sixteen_cases_are_here() -> None:
    assert len(CASES) == 16


def _without_entry(text: str) -> str:
    out = jsontext.rewrite(text, conflist.is_ours, None)
    assert out is not None, text
    return out


def _istio_rm_cni_config(path: pathlib.Path) -> None:
    """Istio's rmCNIConfig: drop the first istio-cni plugin, marshal with sorted keys."""
    config = json.loads(path.read_text())
    plugins = config["plugins"]
    index = next(i for i, p in enumerate(plugins) if p.get("type") == "istio-cni")
    config["plugins"] = plugins[:index] + plugins[index + 1 :]
    atomic_write(
        str(path), (json.dumps(config, indent=2, sort_keys=True) + "\n").encode(), mode=0o644
    )


class Case:
    def __init__(self, node: Node, case: dict[str, Any]) -> None:
        self.node = node
        self.case = case
        self.origin: dict[str, bytes] = {}
        for i, name in enumerate(case["cniConfDirOrderedFiles"]):
            data = (DATA / "pre" / name).read_bytes()
            (node.conf_dir / f"0{i}-{name}").write_bytes(data)
            self.origin[f"0{i}-{name}"] = data
        settings = node.with_settings(
            chained=case["chainedCNIPlugin"],
            cniConfFileName=case["preConfFile"],
            excludeNamespaces=("istio-system",),
            logLevel="debug",
        )
        self.installer = Installer(settings, pod_name=POD[0], pod_namespace=POD[1])
        self.watcher = InstallWatcher(
            self.installer, timing=WatchTiming(step_ms=5, debounce_ms=50, recheck_seconds=0.2)
        )
        self.result = node.conf_dir / case["resultFileName"]

    def matches(self) -> bool:
        """The result holds Istio's expected file, with the differences the docstring names."""
        try:
            text = self.result.read_text()
            got = json.loads(text)
        except (OSError, ValueError):
            return False
        expected_text = (DATA / self.case["expectedOutputFile"]).read_text()
        if not self.case["chainedCNIPlugin"]:
            return got == self.installer.entry | {"cniVersion": got.get("cniVersion")}
        if conflist.count_ours(got) != 1 or got["plugins"][-1] != self.installer.entry:
            return False
        origin = conflist.converted_from(got, self.result.name)
        if origin is None:
            return _without_entry(text) == _without_entry(expected_text)
        expected = json.loads(_without_entry(expected_text))
        source = json.loads(origin[1])
        if "type" in source:  # a .conf: the list keeps its network name
            expected["name"] = source["name"]
        return conflist.remove(conflist.without_converted_from(got)) == expected


@pytest.fixture
def case_on(node: Node) -> Iterator[Any]:
    made: list[Case] = []

    def make(case: dict[str, Any]) -> Case:
        made.append(Case(node, case))
        return made[-1]

    yield make
    for c in made:
        c.watcher.stop()


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_istio_install_case(node: Node, case_on: Any, case: dict[str, Any]) -> None:
    c = case_on(case)
    c.watcher.start()
    if case["delayedConfFile"]:
        time.sleep(0.25)
        assert not c.matches(), "must wait for a valid config file"
        assert not (node.bin_dir / "istio-cni").exists() or not c.result.exists()
        dest = case["preConfFile"] or case["resultFileName"]
        data = (DATA / case["delayedConfFile"]).read_bytes()
        (node.conf_dir / dest).write_bytes(data)
        c.origin[dest] = data
    assert wait_for(lambda: (node.bin_dir / "istio-cni").exists(), timeout=5)
    assert wait_for(c.matches, timeout=5), c.result.read_text()

    # The restart step: our configuration removed; it must come back.
    if case["chainedCNIPlugin"]:
        _istio_rm_cni_config(c.result)
    else:
        c.result.unlink()
    assert wait_for(c.matches, timeout=5), "configuration not restored after removal"

    c.watcher.stop()
    Installer(c.installer.settings, pod_name=POD[0], pod_namespace=POD[1]).uninstall()
    names = sorted(p.name for p in node.conf_dir.iterdir())
    if not case["chainedCNIPlugin"]:
        assert not c.result.exists()
    elif c.result.name in c.origin:
        assert c.result.read_bytes() == (DATA / case["expectedPostCleanFile"]).read_bytes()
    else:  # ours: the .conf we made the list from is back as it was, the list is gone
        assert not c.result.exists()
    assert names == sorted(c.origin), "every file given back, nothing of ours left"
    for name, data in c.origin.items():
        if name != c.result.name:
            assert (node.conf_dir / name).read_bytes() == data, name
    assert not (node.bin_dir / "istio-cni").exists()
    assert not [n for n in names if ".tmp" in n or is_temp_name(n)]


def test_post_clean_of_a_list_equals_istios(node: Node) -> None:
    """Where both agents leave the same file, ours is byte-equal to Istio's expected one: the
    calico list after its entry was removed by Istio's test and ours was spliced out again."""
    shutil.copy(DATA / "pre" / "calico.conflist", node.conf_dir / "00-calico.conflist")
    installer = Installer(node.settings, pod_name=POD[0], pod_namespace=POD[1])
    installer.install()
    _istio_rm_cni_config(node.conf_dir / "00-calico.conflist")
    installer.install()
    installer.uninstall()
    assert (node.conf_dir / "00-calico.conflist").read_bytes() == (
        DATA / "pre" / "calico.conflist"
    ).read_bytes()
