"""Our entries into and out of a CNI config's bytes, every other byte kept where it can be.

A config the agent edits is another writer's file: where only istio-cni entries differ, the
text is rewritten in place (agent.install.jsontext) so the other writer's spelling survives;
otherwise it is written whole.
"""

from __future__ import annotations

import json
from typing import Any

from agent.errors import InstallError
from agent.install import conflist, jsontext


def canonical(value: object) -> str:
    """A JSON value in one spelling, for comparing configs by content."""
    return json.dumps(value, sort_keys=True)


def edited(current: bytes | None, config: dict[str, Any]) -> bytes:
    """The bytes that make `current` hold `config`: where only istio-cni entries differ, the
    current text with just those entries edited (every other byte kept), else `config` whole."""
    if current is not None and "plugins" in config:
        try:
            before = conflist.parse(current, source="")
        except InstallError:
            before = None
        if before is not None and "plugins" in before and _same_but_ours(before, config):
            text = jsontext.rewrite(
                current.decode("utf-8"), conflist.is_ours, config["plugins"][-1]
            )
            if text is not None and canonical(json.loads(text)) == canonical(config):
                return text.encode("utf-8")
    return conflist.dumps(config)


def _same_but_ours(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return canonical(conflist.remove(a)) == canonical(conflist.remove(b))


def without_entries(data: bytes, config: dict[str, Any]) -> bytes:
    """`data` with every istio-cni entry taken out, every other byte kept where it can be."""
    remaining = conflist.remove(config)
    text = jsontext.rewrite(data.decode("utf-8"), conflist.is_ours, None)
    if text is not None and canonical(json.loads(text)) == canonical(remaining):
        return text.encode("utf-8")
    return conflist.dumps(remaining)
