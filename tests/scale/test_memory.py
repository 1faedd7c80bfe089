"""The agent's memory is flat in the cluster's size: with 20,000 pods on other nodes and 2,000
namespaces in the API server, its RSS stays within 10% of its RSS on an empty cluster, and its
start-up asks the API server for no pod of another node (the API server's audit log of the
agent's identity, and what its caches say they listed)."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pytest

from tests.scale.conftest import (
    AGENT_USER,
    NAMESPACES,
    NODE,
    OWN_PODS,
    LoadedApi,
    audit_events,
    listed,
    memory,
)

pytestmark = pytest.mark.scale

RSS_FACTOR = 1.10


def test_memory_is_flat_and_start_up_lists_only_its_node(loaded_api: LoadedApi) -> None:
    assert loaded_api.baseline is not None
    with loaded_api.run_agent() as agent:
        loaded = memory(agent)
        pods, namespaces = listed(agent, "pod"), listed(agent, "namespace")
    print(f"empty cluster: {loaded_api.baseline}; loaded ({loaded_api.loaded}): {loaded}")
    assert pods is not None and namespaces is not None
    assert pods["count"] == OWN_PODS, pods  # this node's pods, none of another
    assert namespaces["count"] >= NAMESPACES, namespaces  # every namespace: a pod may land in any
    assert loaded.rss_mib <= RSS_FACTOR * loaded_api.baseline.rss_mib, (loaded, loaded_api.baseline)
    assert loaded.peak_mib <= RSS_FACTOR * loaded_api.baseline.peak_mib, (
        loaded,
        loaded_api.baseline,
    )
    reads = [
        e
        for e in audit_events(loaded_api.plane)
        if e["user"]["username"] == AGENT_USER and e["objectRef"]["resource"] == "pods"
    ]
    collections = [e for e in reads if e["verb"] in ("list", "watch")]
    assert collections, "the audit log holds the agent's lists and watches of pods"
    for event in collections:
        query = parse_qs(urlsplit(event["requestURI"]).query)
        assert query.get("fieldSelector") == [f"spec.nodeName={NODE}"], event["requestURI"]
    singles = [e for e in reads if e["verb"] == "get"]
    assert not [e for e in singles if e["objectRef"].get("namespace", "").startswith("load-")]
