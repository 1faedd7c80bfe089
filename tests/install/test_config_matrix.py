"""The installer over its configuration space: every cell leaves a node whose runtime starts pods,
and uninstall gives every file that is not ours back byte for byte.

Axes: mode (chained, standalone) x cniConfFileName (unset; naming the primary; naming a missing
file with no other file, beside another valid file, or one that appears later; naming the other
extension of the primary: x.conf when x.conflist exists and back) x the primary's shape (.conf,
.conflist) x its cniVersion (absent, 0.1.0, 0.2.0, 0.3.1, and 1.0.0, the newest the reference
plugins here speak) x the restart step (none; or the primary's CNI writes its file again, ours
removed in standalone mode, and a new agent installs) x the end (uninstall; or an upgrade to
another entry, then uninstall).

After each install, for every cell: our entry is exactly once in the whole conf dir, last, in the
file the settings name (or nowhere while the agent waits for a missing primary, or when it
refuses to write over a foreign file), `problems()` agrees; the config the runtime loads (the
first in name order) loads in libcni and cnitool ADD through it, with the real bridge and
host-local plugins and our static plugin passing the pod through (an excluded namespace), gives
the pod its address, and DEL succeeds; so does ADD through the file holding our entry when the
runtime does not pick it by default (a network called by name, as Multus calls it). After the
uninstall every file not ours is byte-identical and nothing of ours is left (file, binary, temp).
cnitool runs once per distinct config text: its result depends on nothing else.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import pathlib
import secrets
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import pytest

from agent.config import Settings
from agent.errors import InstallError, TransientInstallError
from agent.install import conflist
from agent.install.installer import Installer
from testbed import netns, parts
from testbed.agent_host import write_plugin
from testbed.cni import LIBCNI_CACHE, link_plugins

pytestmark = pytest.mark.netns

MODES = ("chained", "standalone")
NAMED = ("unset", "primary", "missing", "missing-beside-other", "appears-later", "other-extension")
SHAPES = (".conf", ".conflist")
VERSIONS = (None, "0.1.0", "0.2.0", "0.3.1", "1.0.0")
RESTARTS = ("none", "restart")
ENDS = ("uninstall", "upgrade")
NAMED_FILE = "20-named"
POD_ARGS = "IgnoreUnknown=1;K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME=p;K8S_POD_UID={uid}"


@dataclass(frozen=True)
class Cell:
    mode: str
    named: str
    shape: str
    version: str | None
    restart: str
    end: str

    @property
    def id(self) -> str:
        return "-".join(
            [
                self.mode,
                self.named,
                self.shape[1:],
                self.version or "noversion",
                self.restart,
                self.end,
            ]
        )

    @property
    def primary(self) -> str:
        return "10-net" + self.shape

    @property
    def other_extension(self) -> str:
        return "10-net" + (".conflist" if self.shape == ".conf" else ".conf")

    @property
    def named_file(self) -> str:
        return NAMED_FILE + self.shape

    def conf_file_name(self) -> str:
        return {
            "unset": "",
            "primary": self.primary,
            "other-extension": self.other_extension,
        }.get(self.named, self.named_file)

    def files_at_start(self) -> list[str]:
        """The foreign config files on the node before the first install."""
        if self.named in ("missing", "appears-later"):
            return []
        return [self.primary]

    def file_appearing_later(self) -> str | None:
        if self.named != "appears-later":
            return None
        return self.named_file if self.mode == "chained" else self.primary

    def holder(self) -> str | None:
        """The file that holds our entry once installed; None: nowhere (waiting, refused)."""
        if self.mode == "standalone":
            if self.named == "primary":
                return None
            name = self.conf_file_name() or "YYY-istio-cni.conf"
            return name
        if self.named in ("missing", "missing-beside-other"):
            return None
        source = self.named_file if self.named == "appears-later" else self.primary
        return conflist.list_file_name(source)


CELLS = [Cell(*axes) for axes in itertools.product(MODES, NAMED, SHAPES, VERSIONS, RESTARTS, ENDS)]


def primary_config(network: str, shape: str, version: str | None, bridge: str, ipam: str) -> bytes:
    """A bridge + host-local network as a provider writes it (its own key order and indent)."""
    plugin = {
        "type": "bridge",
        "bridge": bridge,
        "isGateway": True,
        "ipam": {"type": "host-local", "subnet": "10.251.0.0/24", "dataDir": ipam},
    }
    head: dict[str, Any] = {} if version is None else {"cniVersion": version}
    config = (
        {**head, "name": network, **plugin}
        if shape == ".conf"
        else {**head, "name": network, "plugins": [plugin]}
    )
    return (json.dumps(config, indent=4) + "\n").encode()


class Runtime:
    """cnitool in a node netns of its own: ADD then DEL through one config file, cached by text."""

    def __init__(self, root: pathlib.Path, cnitool: pathlib.Path, plugin: pathlib.Path) -> None:
        self.root = root
        self.cnitool = cnitool
        self.bin_dir = root / "bin"
        self.bin_dir.mkdir()
        link_plugins(parts.cni_plugins_dir(), self.bin_dir)
        shutil.copy(plugin / "istio-cni", self.bin_dir / "istio-cni")
        self.stand_in = root / "stand-in"
        write_plugin(self.stand_in)
        self.node = netns.unique_name("tb-matrix")
        self.bridge = f"tbm{secrets.token_hex(4)}"
        self.prefix = f"mx{secrets.token_hex(3)}"
        """Network names start with it, so libcni's cache entries can be found and removed."""
        self.ipam = str(root / "ipam")
        self.verdicts: dict[tuple[str, bytes], str | None] = {}
        netns.add(self.node)

    def close(self) -> None:
        netns.delete(self.node)

    def starts_pods(self, name: str, data: bytes) -> str | None:
        """Why a pod would not start through this config file (None: it starts)."""
        key = (os.path.splitext(name)[1], data)
        if key not in self.verdicts:
            self.verdicts[key] = self._add_and_delete(name, data, self.bin_dir)
        return self.verdicts[key]

    def _add_and_delete(self, name: str, data: bytes, bin_dir: pathlib.Path) -> str | None:
        scratch = self.root / f"netconf-{len(self.verdicts)}"
        scratch.mkdir()
        (scratch / name).write_bytes(data)
        config = json.loads(data)
        pod = netns.unique_name("tb-mpod")
        path = netns.add(pod)
        cached = LIBCNI_CACHE / f"{config['name']}-{_container_id(path)}-eth0"
        try:
            added = self._cnitool("add", config["name"], path, scratch, bin_dir)
            if added.returncode != 0:
                return f"ADD: {added.stdout.strip()} {added.stderr.strip()[-500:]}"
            result = json.loads(added.stdout)
            if not conflist.only_ours(config) and not (result.get("ips") or result.get("ip4")):
                return f"ADD gave the pod no address: {added.stdout.strip()}"
            deleted = self._cnitool("del", config["name"], path, scratch, bin_dir)
            if deleted.returncode != 0:
                return f"DEL: {deleted.stdout.strip()} {deleted.stderr.strip()[-500:]}"
            return None
        finally:
            netns.delete(pod)
            cached.unlink(missing_ok=True)
            shutil.rmtree(scratch, ignore_errors=True)

    def _cnitool(
        self, command: str, network: str, path: pathlib.Path, conf: pathlib.Path, bins: pathlib.Path
    ) -> subprocess.CompletedProcess[str]:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "NETCONFPATH": str(conf),
            "CNI_PATH": str(bins),
            "CNI_ARGS": POD_ARGS.format(uid=uuid.uuid4()),
            "CNI_IFNAME": "eth0",
        }
        argv = ["ip", "netns", "exec", self.node, str(self.cnitool), command, network, str(path)]
        return subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=60, check=False
        )


def _container_id(netns_path: pathlib.Path) -> str:
    """cnitool's container id for a netns path (libcni caches results under it)."""
    return "cnitool-" + hashlib.sha512(str(netns_path).encode()).digest()[:10].hex()


def ours_in(config: dict[str, Any]) -> int:
    """istio-cni entries in a config: a single ours counts one, a list its entries."""
    return (
        1
        if conflist.is_single(config) and conflist.is_ours(config)
        else conflist.count_ours(config)
    )


@pytest.fixture(scope="module")
def runtime(
    tmp_path_factory: pytest.TempPathFactory, plugin_build: pathlib.Path
) -> Iterator[Runtime]:
    cnitool = parts.cnitool().require()
    rt = Runtime(tmp_path_factory.mktemp("matrix-runtime"), cnitool, plugin_build)
    try:
        yield rt
    finally:
        rt.close()


class Node:
    """One cell's node: conf dir, bin dir (the reference plugins as links), the agent's settings.

    The agent installs a stand-in executable (copying the 6 MB build 960 times with fsync tests
    nothing the kill tier does not); the runtime runs the real static build from its own bin dir
    (the same file the agent would have copied)."""

    def __init__(self, root: pathlib.Path, cell: Cell, runtime: Runtime) -> None:
        self.cell = cell
        self.runtime = runtime
        self.conf_dir, self.bin_dir = root / "conf", root / "bin"
        self.conf_dir.mkdir()
        self.bin_dir.mkdir()
        link_plugins(parts.cni_plugins_dir(), self.bin_dir)
        self.bins_before = sorted(os.listdir(self.bin_dir))
        self.settings = Settings(
            mountedCniBinDir=str(self.bin_dir),
            mountedCniConfDir=str(self.conf_dir),
            pluginSourceDir=str(runtime.stand_in),
            cniAgentRunDir=str(runtime.root / "run"),  # one entry text for every cell
            chained=cell.mode == "chained",
            cniConfFileName=cell.conf_file_name(),
        )
        self.written: dict[str, bytes] = {}
        """Every foreign file as its owner last wrote it."""

    def write_foreign(self, name: str) -> None:
        network = f"{self.runtime.prefix}-{name.split('-')[0]}"
        data = primary_config(network, self.cell.shape, self.cell.version, *self._bridge())
        (self.conf_dir / name).write_bytes(data)
        os.chmod(self.conf_dir / name, 0o644)
        self.written[name] = data

    def _bridge(self) -> tuple[str, str]:
        return self.runtime.bridge, self.runtime.ipam

    def install(self, settings: Settings | None = None) -> tuple[Installer, str]:
        """A new agent's install; returns it and "installed", "waiting" or "refused"."""
        installer = Installer(
            settings or self.settings, pod_name="istio-cni-node-x", pod_namespace="kube-system"
        )
        try:
            report = installer.install()
        except TransientInstallError:
            return installer, "waiting"
        except InstallError:
            return installer, "refused"
        return installer, "installed, warned" if report.warnings else "installed"

    def violations(self, installer: Installer, outcome: str) -> list[str]:
        """What is wrong with the node right now, as the runtime and the agent see it."""
        cell, out = self.cell, []
        holder = cell.holder()
        want = "installed" if holder else ("refused" if cell.mode == "standalone" else "waiting")
        if holder and cell.mode == "standalone" and holder < cell.primary:
            want += ", warned"  # ours would be the runtime's pick: the pod network
        if outcome != want:
            out.append(f"install {outcome}, want {want}")
        names = conflist.candidate_names(os.listdir(self.conf_dir))
        ours = {n: ours_in(self._list(n)) for n in names}
        if sum(ours.values()) != (1 if holder else 0) or (holder and ours.get(holder) != 1):
            out.append(f"our entry in {ours}, want once in {holder}")
        if holder and cell.mode == "chained" and cell.shape == ".conf":
            want_version = cell.version if cell.version in ("0.3.1", "1.0.0") else "0.3.1"
            if self._list(holder).get("cniVersion") != want_version:
                out.append(f"{holder}: cniVersion {self._list(holder).get('cniVersion')!r}")
        if holder and installer.problems():
            out.append(f"problems: {installer.problems()}")
        for name in names:
            unchanged = (self.conf_dir / name).read_bytes() == self.written.get(name)
            if name != holder and name in self.written and not unchanged:
                out.append(f"{name} changed")
        checked = [names[0]] if names else []
        if holder and holder not in checked:
            checked.append(holder)
        for name in checked:
            why = self.runtime.starts_pods(name, (self.conf_dir / name).read_bytes())
            if why is not None:
                out.append(f"a pod does not start through {name}: {why}")
        return out

    def _list(self, name: str) -> dict[str, Any]:
        config: dict[str, Any] = json.loads((self.conf_dir / name).read_bytes())
        return config

    def after_uninstall(self) -> list[str]:
        out = []
        names = sorted(os.listdir(self.conf_dir))
        if names != sorted(self.written):
            out.append(f"conf dir holds {names}, want {sorted(self.written)}")
        for name, data in self.written.items():
            path = self.conf_dir / name
            if not path.exists() or path.read_bytes() != data:
                out.append(f"{name} not given back byte for byte")
            elif os.stat(path).st_mode & 0o777 != 0o644:
                out.append(f"{name} mode changed")
        if sorted(os.listdir(self.bin_dir)) != self.bins_before:
            out.append(f"bin dir holds {sorted(os.listdir(self.bin_dir))}")
        return out


def _restart(node: Node) -> None:
    """The primary's CNI writes its file again (without our entry); in standalone mode ours is
    removed too, as Istio's installer test does."""
    cell = node.cell
    for name in list(node.written):
        node.write_foreign(name)
    holder = cell.holder()
    if cell.mode == "standalone" and holder and (node.conf_dir / holder).exists():
        (node.conf_dir / holder).unlink()


@pytest.mark.parametrize("cell", CELLS, ids=[c.id for c in CELLS])
def test_cell(cell: Cell, runtime: Runtime, tmp_path: pathlib.Path) -> None:
    node = Node(tmp_path, cell, runtime)
    for name in cell.files_at_start():
        node.write_foreign(name)
    installer, outcome = node.install()
    if (later := cell.file_appearing_later()) is not None:
        node.write_foreign(later)
        installer, outcome = node.install()
    assert node.violations(installer, outcome) == [], "after install"
    if cell.restart == "restart":
        _restart(node)
        installer, outcome = node.install()
        assert node.violations(installer, outcome) == [], "after the restart step"
    if cell.end == "upgrade":
        upgraded = replace(node.settings, logLevel="debug", excludeNamespaces=("kube-system", "x"))
        installer, outcome = node.install(upgraded)
        assert node.violations(installer, outcome) == [], "after the upgrade"
        entries = [
            p
            for n in conflist.candidate_names(os.listdir(node.conf_dir))
            for p in node._list(n).get("plugins", [node._list(n)])
            if conflist.is_ours(p)
        ]
        assert all(e["plugin_log_level"] == "debug" for e in entries), entries
    Installer(
        installer.settings, pod_name="istio-cni-node-y", pod_namespace="kube-system"
    ).uninstall()
    assert node.after_uninstall() == []
