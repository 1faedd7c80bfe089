"""Waiting on the API server's events (testbed/kubewatch.py), against the real kube-apiserver:
a change made while the wait runs is seen, deletions leave the judged set, and a timeout names
what was awaited and the objects last seen."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from testbed import kubewatch
from testbed.wait import WaitTimeout, diagnostics

pytestmark = pytest.mark.cluster


def config_map(name: str, value: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "data": {"v": value}}


def test_a_change_made_during_the_wait_is_seen(
    kube_core: Any, random_namespace_function_scope: Any
) -> None:
    namespace = random_namespace_function_scope.name
    kube_core.create_namespaced_config_map(namespace, config_map("watched", "before"))
    later = threading.Timer(
        1.0,
        lambda: kube_core.patch_namespaced_config_map(
            "watched", namespace, {"data": {"v": "after"}}
        ),
    )
    later.start()
    try:
        found = kubewatch.watch_until(
            kube_core.list_namespaced_config_map,
            lambda maps: next((m for m in maps if (m.data or {}).get("v") == "after"), None),
            "the ConfigMap changed",
            30,
            namespace=namespace,
            field_selector="metadata.name=watched",
        )
    finally:
        later.join()
    assert found.metadata.name == "watched" and found.data == {"v": "after"}


def test_a_deleted_object_leaves_the_judged_set(
    kube_core: Any, random_namespace_function_scope: Any
) -> None:
    namespace = random_namespace_function_scope.name
    for name in ("stays", "goes"):
        kube_core.create_namespaced_config_map(namespace, config_map(name, "x"))
    later = threading.Timer(1.0, lambda: kube_core.delete_namespaced_config_map("goes", namespace))
    later.start()
    try:
        names = kubewatch.watch_until(
            kube_core.list_namespaced_config_map,
            lambda maps: (
                sorted(m.metadata.name for m in maps if m.metadata.name != "kube-root-ca.crt")
                == ["stays"]
            ),
            "only 'stays' left",
            30,
            namespace=namespace,
        )
    finally:
        later.join()
    assert names is True


def test_a_timeout_names_the_wait_the_objects_seen_and_the_diagnostics(
    kube_core: Any, random_namespace_function_scope: Any
) -> None:
    namespace = random_namespace_function_scope.name
    kube_core.create_namespaced_config_map(namespace, config_map("never", "same"))
    with (
        diagnostics(lambda: "controller manager said nothing"),
        pytest.raises(WaitTimeout) as failed,
    ):
        kubewatch.watch_until(
            kube_core.list_namespaced_config_map,
            lambda maps: None,
            "a change that never comes",
            2,
            namespace=namespace,
            field_selector="metadata.name=never",
        )
    text = str(failed.value)
    assert "waiting for a change that never comes" in text
    assert f"{namespace}/never" in text and "controller manager said nothing" in text
