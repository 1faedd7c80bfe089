"""Taints on the real node, changed as a node pool or an operator would (a JSON patch guarded by
the node's resourceVersion, so a concurrent writer's change is never lost)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from typing import Any

from kubernetes.client.exceptions import ApiException

from agent.node_taint import TAINT_KEY

NOT_READY = {"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"}

Taints = list[dict[str, Any]]


def taints(core: Any, node: str) -> Taints:
    found: Taints = (
        json.loads(core.read_node(node, _preload_content=False).data)["spec"].get("taints") or []
    )
    return found


def keys(found: Taints) -> set[str]:
    return {t["key"] for t in found}


def set_taints(core: Any, node: str, change: Callable[[Taints], Taints]) -> None:
    """Set the node's taints to change(current), only if the node did not change meanwhile."""
    for _ in range(10):
        node_obj = json.loads(core.read_node(node, _preload_content=False).data)
        current = node_obj["spec"].get("taints") or []
        try:
            core.patch_node(
                node,
                [
                    {
                        "op": "test",
                        "path": "/metadata/resourceVersion",
                        "value": node_obj["metadata"]["resourceVersion"],
                    },
                    {"op": "add", "path": "/spec/taints", "value": change(current)},
                ],
                _content_type="application/json-patch+json",
            )
            return
        except ApiException as e:  # 422: changed meanwhile (the test op): read again
            if e.status != 422:
                raise
    raise AssertionError(f"could not change the taints of {node}")


def add(core: Any, node: str, *added: dict[str, Any]) -> None:
    names = {t["key"] for t in added}
    set_taints(core, node, lambda ts: [t for t in ts if t["key"] not in names] + list(added))


def remove(core: Any, node: str, *names: str) -> None:
    set_taints(core, node, lambda ts: [t for t in ts if t["key"] not in names])


@contextlib.contextmanager
def tainted(core: Any, node: str, *added: dict[str, Any]) -> Iterator[str]:
    """The node with `added` taints; they are removed at the end, whatever happened."""
    add(core, node, *added)
    try:
        yield node
    finally:
        remove(core, node, *(t["key"] for t in added))
