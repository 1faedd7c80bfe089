"""The file the agent chains into is the one libcni would load, judged by libcni itself.

testbed/libcni_oracle (built on libcni v1.3.0 from the Go module proxy by ci/setup-testbed)
prints the file a runtime would load from a conf dir: the first of libcni's ConfFiles, in name
order, that loads. On every conf dir of a corpus (the real-world configs of the conformance data,
each alone and after every unusual file: bytes that are not UTF-8, over 1 MiB, a list with a
stray top-level type, a lone surrogate escape, symlinks, directories and names libcni skips or
takes, fields libcni refuses) the agent's choice is that file: the primary it plans to chain
into, or the file it refuses to chain into because it cannot edit it (it never chains into
another one). The one intended difference: a dangling symlink, which libcni here cannot follow
but the runtime on a node may (an absolute node path), is refused, not skipped.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from agent.errors import InstallError, TransientInstallError
from agent.install import conflist
from agent.install.installer import Installer
from testbed.agent_host import Node
from testbed.parts import libcni_oracle
from tests.install.conftest import conformance_dir

pytestmark = pytest.mark.differential

REAL_WORLD = conformance_dir() / "real-world"
REAL = sorted(p.name for p in REAL_WORLD.iterdir() if p.suffix in (".conf", ".conflist"))
LIST = {"cniVersion": "0.4.0", "name": "net", "plugins": [{"type": "ptp"}, {"type": "portmap"}]}
CONF = {"cniVersion": "0.3.1", "name": "net", "type": "bridge"}


def _json(value: object) -> bytes:
    return json.dumps(value).encode()


Writer = Callable[[pathlib.Path], None]


def _file(name: str, data: bytes) -> Writer:
    def write(d: pathlib.Path) -> None:
        (d / name).write_bytes(data)

    return write


def _symlink(name: str, target: str, content: bytes | None = None) -> Writer:
    """A symlink `name` to `target` (relative to the conf dir's parent when not absolute),
    the target holding `content` (None: dangling)."""

    def write(d: pathlib.Path) -> None:
        path = pathlib.Path(target) if os.path.isabs(target) else d.parent / target
        if content is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content)
        (d / name).symlink_to(path)

    return write


def _dir(name: str) -> Writer:
    return lambda d: (d / name).mkdir()


ODD: dict[str, Writer] = {
    "non-utf8": _file("05-odd.conflist", _json({**LIST, "name": "n-X"}).replace(b"n-X", b"n-\xff")),
    "over-1mib": _file(
        "05-odd.conflist", _json({**LIST, "pad": "x" * (conflist.MAX_CONFIG_BYTES + 10)})
    ),
    "conflist-stray-type": _file("05-odd.conflist", _json({**LIST, "type": "bridge"})),
    "conf-surrogate": _file(
        "05-odd.conf", b'{"cniVersion": "0.4.0", "name": "n\\ud800", "type": "bridge"}'
    ),
    "conf-holding-a-list": _file("05-odd.conf", _json(LIST)),
    "truncated": _file("05-odd.conflist", _json(LIST)[:-3]),
    "bom": _file("05-odd.conflist", b"\xef\xbb\xbf" + _json(LIST)),
    "empty-file": _file("05-odd.conf", b""),
    "json-null": _file("05-odd.conf", b"null"),
    "no-name": _file("05-odd.conflist", _json({"cniVersion": "0.4.0", "plugins": [{"type": "a"}]})),
    "name-not-string": _file("05-odd.conflist", _json({**LIST, "name": 5})),
    "version-not-string": _file("05-odd.conflist", _json({**LIST, "cniVersion": 4})),
    "empty-plugins": _file("05-odd.conflist", _json({**LIST, "plugins": []})),
    "plugins-not-list": _file("05-odd.conflist", _json({**LIST, "plugins": {"type": "ptp"}})),
    "plugin-without-type": _file("05-odd.conflist", _json({**LIST, "plugins": [{"name": "x"}]})),
    "conf-empty-type": _file("05-odd.conf", _json({**CONF, "type": ""})),
    "conf-no-type": _file("05-odd.conf", _json({"cniVersion": "0.3.1", "name": "n"})),
    "duplicate-keys": _file(
        "05-odd.conflist", b'{"name": "a", "name": "b", "plugins": [{"type": "ptp"}]}'
    ),
    "disable-check-not-bool": _file("05-odd.conflist", _json({**LIST, "disableCheck": "maybe"})),
    "disable-check-word": _file("05-odd.conflist", _json({**LIST, "disableCheck": "TRUE"})),
    "cni-versions-bad": _file("05-odd.conflist", _json({**LIST, "cniVersions": ["x.y"]})),
    "cni-versions-newer": _file("05-odd.conflist", _json({**LIST, "cniVersions": ["9.0.0"]})),
    "capabilities-not-bool": _file(
        "05-odd.conflist",
        _json({**LIST, "plugins": [{"type": "portmap", "capabilities": {"portMappings": "on"}}]}),
    ),
    "ipam-not-object": _file("05-odd.conf", _json({**CONF, "ipam": "host-local"})),
    "type-capitalised": _file("05-odd.conflist", _json({**LIST, "plugins": [{"Type": "ptp"}]})),
    "conf-type-capitalised": _file("05-odd.conf", _json({"cniVersion": "0.3.1", "Type": "ptp"})),
    "dns-not-object": _file(
        "05-odd.conflist", _json({**LIST, "plugins": [{"type": "a", "dns": []}]})
    ),
    "prev-result-list": _file("05-odd.conf", _json({**CONF, "prevResult": []})),
    "version-null": _file("05-odd.conflist", _json({**LIST, "cniVersion": None})),
    "conf-version-null": _file("05-odd.conf", _json({**CONF, "cniVersion": None})),
    "name-capitalised": _file("05-odd.conflist", _json({"Name": "n", "plugins": [{"type": "a"}]})),
    "type-last-empty": _file("05-odd.conf", b'{"name": "n", "type": "bridge", "TYPE": ""}'),
    "plugin-null": _file("05-odd.conflist", _json({**LIST, "plugins": [None]})),
    "plugin-type-number": _file("05-odd.conflist", _json({**LIST, "plugins": [{"type": 1}]})),
    "disable-gc-null": _file("05-odd.conflist", _json({**LIST, "disableGC": None})),
    "cni-versions-signed": _file("05-odd.conflist", _json({**LIST, "cniVersions": ["+1.0"]})),
    "attachments-wrong": _file(
        "05-odd.conf", _json({**CONF, "cni.dev/valid-attachments": [{"ifname": 1}]})
    ),
    "inline-only-without-plugins": _file(
        "05-odd.conflist", _json({"name": "n", "loadOnlyInlinedPlugins": True})
    ),
    "json-ext": _file("05-odd.json", _json(CONF)),
    "upper-ext": _file("05-odd.CONF", _json(CONF)),
    "backup-name": _file("05-odd.conflist.bak", _json(LIST)),
    "hidden": _file(".05-odd.conflist", _json(LIST)),
    "only-extension": _file(".conflist", _json(LIST)),
    "directory": _dir("05-odd.conflist"),
    "symlink-in-dir": _symlink("05-odd.conflist", "conf/10-target.conflist.real", _json(LIST)),
    "symlink-outside": _symlink("05-odd.conflist", "elsewhere/net.conflist", _json(LIST)),
    "symlink-to-broken": _symlink("05-odd.conflist", "elsewhere/bad.conflist", b"{"),
}

REFUSED = {
    "non-utf8",
    "over-1mib",
    "conflist-stray-type",
    "conf-surrogate",
    "type-capitalised",
    "conf-type-capitalised",
    "conf-version-null",
}
"""Files libcni loads that the agent cannot edit (or not without changing what libcni reads):
it refuses, naming them."""


@dataclass(frozen=True)
class Case:
    id: str
    writers: tuple[Writer, ...]


def _real(name: str, as_name: str | None = None) -> Writer:
    return _file(as_name or f"10-{name}", (REAL_WORLD / name).read_bytes())


def _cases() -> list[Case]:
    cases = [Case(f"real-{name}", (_real(name),)) for name in REAL]
    for i, (odd, writer) in enumerate(sorted(ODD.items())):
        real = REAL[i % len(REAL)]
        cases.append(Case(f"{odd}-then-{real}", (writer, _real(real))))
    cases.append(Case("odd-alone-dangling", (_symlink("05-odd.conflist", "/nonexistent/x"),)))
    for a, b in zip(REAL, REAL[1:] + REAL[:1], strict=True):
        cases.append(Case(f"pair-{a}-{b}", (_real(a, f"20-{a}"), _real(b, f"10-b-{b}"))))
    return cases


CASES = _cases()


def oracle(conf_dir: pathlib.Path) -> str | None:
    done = subprocess.run(
        [str(libcni_oracle().require()), str(conf_dir)],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return done.stdout.strip() or None


def agents_choice(node: Node) -> tuple[str | None, str]:
    """(file, how): the primary it plans to chain into ("chains"), the file it refuses
    ("refuses"), or None when it waits for one ("waits")."""
    installer = Installer(node.settings, pod_name="agent-1", pod_namespace="istio-system")
    try:
        return installer.plan().primary, "chains"
    except TransientInstallError:
        return None, "waits"
    except InstallError as e:
        path = str(e).split(": ", 1)[0]
        assert os.path.dirname(path) == str(node.conf_dir), str(e)
        return os.path.basename(path), "refuses"


def test_the_corpus_covers_every_real_world_config_and_unusual_file() -> None:
    assert len(REAL) == 29
    assert len(CASES) == 29 + len(ODD) + 1 + 29


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_the_agent_chooses_the_file_libcni_loads(node: Node, case: Case) -> None:
    for write in case.writers:
        write(node.conf_dir)
    loaded = oracle(node.conf_dir)
    chosen, how = agents_choice(node)
    if case.id == "odd-alone-dangling":
        assert (loaded, chosen, how) == (None, "05-odd.conflist", "refuses")
        return
    assert chosen == loaded, f"libcni loads {loaded}; the agent {how} {chosen}"
    odd = case.id.split("-then-")[0]
    assert how == ("refuses" if odd in REFUSED else "chains" if loaded else "waits")
