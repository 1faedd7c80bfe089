"""Our entry edited in a config's own text: added last in the list's style, removed exactly."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agent.install import conflist, jsontext
from tests.install.kill_rig import SOURCES

ENTRY = {"name": "istio-cni", "type": "istio-cni", "exclude_namespaces": ["kube-system"]}
STYLES = {
    "indent-4": '{\n    "name": "n",\n    "plugins": [\n        {\n            "type": "a"\n'
    '        },\n        {\n            "type": "b"\n        }\n    ]\n}\n',
    "tabs-crlf": '{\r\n\t"name": "n",\r\n\t"plugins": [\r\n\t\t{\r\n\t\t\t"type": "a"\r\n\t\t}'
    "\r\n\t]\r\n}",
    "compact": '{"name":"n","plugins":[{"type":"a"},{"type":"b"}],"cniVersion":"1.0.0"}',
    "spaced": '{ "name" : "n" , "plugins" : [ { "type" : "a" } ] }\n',
}


def _with_ours(text: str) -> str:
    out = jsontext.rewrite(text, conflist.is_ours, ENTRY)
    assert out is not None
    return out


@pytest.mark.parametrize("name", sorted(STYLES), ids=sorted(STYLES))
def test_added_last_then_removed_to_the_same_bytes(name: str) -> None:
    text = STYLES[name]
    added = _with_ours(text)
    config = json.loads(added)
    assert config["plugins"][-1] == ENTRY
    assert config["plugins"][:-1] == json.loads(text)["plugins"]
    assert jsontext.rewrite(added, conflist.is_ours, None) == text
    assert _with_ours(added) == added, "a second install changes nothing"


def test_entry_is_indented_like_the_list() -> None:
    added = _with_ours(STYLES["tabs-crlf"])
    assert '\r\n\t\t{\r\n\t\t\t"name": "istio-cni",' in added
    assert '{"name":"istio-cni"' in _with_ours(STYLES["compact"])


@pytest.mark.parametrize("provider", sorted(n for n in SOURCES if n.endswith(".conflist")))
def test_every_real_provider_list_round_trips(provider: str) -> None:
    text = SOURCES[provider].read_text()
    added = _with_ours(text)
    assert json.loads(added) == conflist.insert(json.loads(text), ENTRY)
    assert jsontext.rewrite(added, conflist.is_ours, None) == text


def test_stale_entries_anywhere_are_cut_and_one_appended() -> None:
    text = '{"plugins": [{"type": "istio-cni", "old": 1}, {"type": "a"},\n {"type": "istio-cni"}]}'
    out = _with_ours(text)
    assert json.loads(out)["plugins"] == [{"type": "a"}, ENTRY]
    assert jsontext.rewrite(text, conflist.is_ours, None) == '{"plugins": [{"type": "a"}]}'


@pytest.mark.parametrize(
    "text",
    ['{"type": "bridge"}', "[1]", '{"plugins": {}}', '{"plugins": [1,}', '{"a": 1} trailing'],
    ids=["single", "array", "plugins-object", "broken", "trailing"],
)
def test_no_list_in_place_means_none(text: str) -> None:
    assert jsontext.rewrite(text, conflist.is_ours, ENTRY) is None


def test_the_last_plugins_key_is_the_one_edited() -> None:
    """A JSON parser keeps the last of two equal keys: so do we."""
    text = '{"plugins": [{"type": "x"}], "plugins": [{"type": "a"}]}'
    parsed: Any = json.loads(_with_ours(text))
    assert parsed["plugins"] == [{"type": "a"}, ENTRY]
