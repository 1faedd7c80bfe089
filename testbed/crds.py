"""CustomResourceDefinitions a test applies for the time it runs: created, waited for until
served, deleted and waited for until gone."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kubernetes import client as k8s

from testbed.wait import wait_for

ESTABLISHED_TIMEOUT = 30.0


def wait_established(ext: Any, name: str, timeout: float = ESTABLISHED_TIMEOUT) -> None:
    """Until the CRD's Established condition is True (its resource is then served)."""
    conditions: list[Any] = []

    def established() -> bool:
        nonlocal conditions
        status = ext.read_custom_resource_definition(name).status
        conditions = (status.conditions if status else None) or []
        return any(c.type == "Established" and c.status == "True" for c in conditions)

    wait_for(
        established,
        f"CRD {name} Established",
        timeout,
        interval=0.2,
        on_timeout=lambda: f"{conditions}",
    )


@contextmanager
def applied(api_client: Any, body: dict[str, Any], gone_timeout: float = 60.0) -> Iterator[None]:
    """The CRD `body` served while the block runs; deleted after, and gone before returning."""
    ext: Any = k8s.ApiextensionsV1Api(api_client)
    name = body["metadata"]["name"]
    ext.create_custom_resource_definition(body)
    try:
        wait_established(ext, name)
        yield
    finally:
        ext.delete_custom_resource_definition(name)

        def gone() -> bool:
            try:
                ext.read_custom_resource_definition(name)
            except k8s.ApiException as e:
                return bool(e.status == 404)
            return False

        wait_for(gone, f"CRD {name} deleted", gone_timeout)
