"""Pure config functions: selection as the runtime does it, insertion, removal, validation."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from agent.errors import InstallError
from agent.install import conflist

BRIDGE = {"cniVersion": "1.0.0", "name": "net", "type": "bridge"}
LIST = {"cniVersion": "1.0.0", "name": "net", "plugins": [{"type": "ptp"}, {"type": "portmap"}]}
ENTRY = {"name": "istio-cni", "type": "istio-cni", "plugin_log_level": "info"}


def _reader(files: Mapping[str, object]) -> Callable[[str], bytes | None]:
    def read(name: str) -> bytes | None:
        value = files.get(name)
        if value is None:
            return None
        return value if isinstance(value, bytes) else json.dumps(value).encode()

    return read


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"20-b.conflist": LIST, "10-a.conf": BRIDGE}, "10-a.conf"),
        ({"10-a.conf": b"{not json", "20-b.conflist": LIST}, "20-b.conflist"),
        (
            {"10-a.conf": {"name": "x", "plugins": LIST["plugins"]}, "20-b.json": BRIDGE},
            "20-b.json",
        ),
        ({"10-a.conflist": {"name": "x", "plugins": []}, "20-b.conf": BRIDGE}, "20-b.conf"),
        ({"10-a.conflist": {"name": "x"}, "30-c.conflist": LIST}, "30-c.conflist"),
        ({"10-a.conflist": BRIDGE, "30-c.conflist": LIST}, "30-c.conflist"),
        ({"05-x.yaml": LIST, "10-a.txt": BRIDGE}, None),
        ({"10-a.conf": [], "11-b.conf": {}, "12-c.conf": "str"}, None),
        ({"1-k8s.conflist": LIST, "10-a.conflist": LIST}, "1-k8s.conflist"),
    ],
    ids=[
        "sorted-first",
        "skip-unparsable",
        "conf-without-type",
        "list-without-plugins",
        "list-no-plugins-key",
        "single-in-conflist",
        "other-extensions",
        "garbage",
        "byte-order",
    ],
)
def test_select_primary_as_runtime(files: dict[str, object], expected: str | None) -> None:
    assert conflist.select_primary(files, _reader(files)) == expected


def test_select_primary_excludes() -> None:
    files = {"02-istio.conflist": LIST, "10-a.conflist": LIST}
    assert conflist.select_primary(files, _reader(files), exclude={"02-istio.conflist"}) == (
        "10-a.conflist"
    )


@pytest.mark.parametrize(
    ("names", "wanted", "expected"),
    [
        ({"a.conf", "b.conflist"}, "b.conflist", "b.conflist"),
        ({"a.conf", "b.conflist"}, "b.conf", "b.conflist"),
        ({"a.conf", "b.conflist"}, "a.conflist", "a.conf"),
        ({"a.conf"}, "never.conf", None),
        ({"undetectable.file"}, "undetectable.file", "undetectable.file"),
    ],
)
def test_resolve_named(names: set[str], wanted: str, expected: str | None) -> None:
    assert conflist.resolve_named(names, wanted) == expected


def test_insert_keeps_order_and_appends_last() -> None:
    existing: dict[str, Any] = {
        "name": "n",
        "cniVersion": "0.3.1",
        "zeta": 1,
        "plugins": [
            {"type": "calico", "z": 1, "a": 2},
            {"type": "istio-cni", "old": True},
            {"type": "portmap"},
            {"type": "istio-cni"},
        ],
    }
    result = conflist.insert(existing, ENTRY)
    assert list(result) == ["name", "cniVersion", "zeta", "plugins"]
    assert result["plugins"] == [{"type": "calico", "z": 1, "a": 2}, {"type": "portmap"}, ENTRY]
    assert list(result["plugins"][0]) == ["type", "z", "a"]
    assert existing["plugins"][1] == {"type": "istio-cni", "old": True}, "input not mutated"


def test_insert_wraps_single_keeping_name_and_version() -> None:
    result = conflist.insert(BRIDGE, {**ENTRY, "cniVersion": "0.3.1"})
    assert result == {
        "cniVersion": "1.0.0",
        "name": "net",
        "plugins": [{"name": "net", "type": "bridge"}, ENTRY],
    }
    nameless = conflist.insert({"type": "bridge"}, ENTRY)
    assert nameless["name"] == conflist.WRAPPED_LIST_NAME


@pytest.mark.parametrize(
    ("version", "listed"),
    [
        (None, "0.3.1"),  # libcni would hand "" to every plugin of the list
        ("", "0.3.1"),
        ("0.1.0", "0.3.1"),  # lists and chaining begin at 0.3.0
        ("0.2.0", "0.3.1"),
        ("0.3.0", "0.3.0"),
        ("0.4.0", "0.4.0"),
        ("1.1.0", "1.1.0"),
    ],
    ids=["absent", "empty", "0.1.0", "0.2.0", "0.3.0", "0.4.0", "1.1.0"],
)
def test_a_list_made_from_a_conf_always_has_a_list_version(
    version: str | None, listed: str
) -> None:
    conf: dict[str, object] = {"name": "net", "type": "bridge"}
    if version is not None:
        conf["cniVersion"] = version
    result = conflist.insert(conf, ENTRY)
    assert result["cniVersion"] == listed
    assert result["plugins"][0] == {"name": "net", "type": "bridge"}


def test_remove_and_has_entry() -> None:
    installed = conflist.insert(LIST, ENTRY)
    assert conflist.has_entry(installed, ENTRY)
    assert not conflist.has_entry(installed, {**ENTRY, "plugin_log_level": "debug"})
    assert conflist.remove(installed) == LIST
    twice = {**LIST, "plugins": [*LIST["plugins"], ENTRY, ENTRY]}
    assert not conflist.has_entry(twice, ENTRY)
    not_last = {**LIST, "plugins": [ENTRY, *LIST["plugins"]]}
    assert not conflist.has_entry(not_last, ENTRY)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"{", "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
        (b"[]", "must be a JSON object, got an array"),
        (b'"x"', "must be a JSON object, got a string"),
        (b"{}", "empty object"),
        (b'{"name": "n", "plugins": {}}', "plugins must be a list, got an object"),
        (b'{"name": "n", "plugins": []}', "plugins is an empty list"),
        (b'{"name": "n", "plugins": [1]}', "plugins[0] must be an object, got a number"),
        (b'{"name": "n", "plugins": [{"type": 3}]}', "plugins[0].type must be a non-empty string"),
        (b'{"name": 5, "plugins": [{"type": "x"}]}', "name must be a string, got a number"),
        (b'{"cniVersion": 1.0, "type": "x"}', "cniVersion must be a string"),
        (b'{"type": ""}', "type must be a non-empty string"),
        (b'{"name": "n"}', "neither type (.conf) nor plugins"),
        (b'{"type": "x", "mtu": NaN}', "not valid JSON"),
        (b" " * (conflist.MAX_CONFIG_BYTES + 1), "larger than"),
    ],
    ids=[
        "truncated",
        "not-utf8",
        "array",
        "string",
        "empty-object",
        "plugins-object",
        "plugins-empty",
        "plugin-number",
        "type-number",
        "name-number",
        "version-number",
        "type-empty",
        "no-type-no-plugins",
        "nan",
        "huge",
    ],
)
def test_bad_input_named(data: bytes, message: str) -> None:
    with pytest.raises(InstallError) as err:
        conflist.load(data, source="/etc/cni/net.d/10-x.conflist")
    assert "/etc/cni/net.d/10-x.conflist" in str(err.value)
    assert message in str(err.value)


def test_dumps_round_trip() -> None:
    config = {"b": 1, "a": ["é", {"z": None}]}
    data = conflist.dumps(config)
    assert data.endswith(b"}\n") and "é".encode() in data
    assert json.loads(data) == config
    assert list(json.loads(data)) == ["b", "a"]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("10-x.conf", "10-x.conflist"),
        ("10-x.json", "10-x.conflist"),
        ("10-x.conflist", "10-x.conflist"),
        ("undetectable.file", "undetectable.file"),
    ],
)
def test_list_file_name(name: str, expected: str) -> None:
    assert conflist.list_file_name(name) == expected
