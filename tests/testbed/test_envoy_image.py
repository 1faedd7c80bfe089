"""The sidecar Envoy image's entrypoint and the TPROXY pod's istio-proxy container: a TPROXY pod
runs the image's other bootstrap with the entrypoint's own flags, as Istio's injector runs the
proxy in that mode (UID 0, GID 1337, NET_ADMIN only)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from testbed import envoy, kubepods

CONTAINERFILE = Path(__file__).resolve().parents[2] / "ci/image/envoy.Containerfile"


def entrypoint() -> list[str]:
    text = CONTAINERFILE.read_text().replace("\\\n", " ")
    found = re.search(r"^ENTRYPOINT (\[.*\])$", text, re.MULTILINE)
    assert found, "no ENTRYPOINT in the envoy image"
    argv: list[str] = json.loads(found.group(1))
    return argv


def test_the_entrypoint_runs_the_default_bootstrap_with_the_flags_a_tproxy_pod_repeats() -> None:
    assert entrypoint() == [
        "/usr/local/bin/envoy", "--config-path", envoy.IMAGE_BOOTSTRAP, *envoy.IMAGE_FLAGS
    ]  # fmt: skip


def test_a_tproxy_pod_runs_its_bootstrap_as_root_with_the_proxy_group_and_net_admin() -> None:
    annotations = {kubepods.INTERCEPTION_MODE: "TPROXY"}
    pod = kubepods.pod_manifest(
        "p", "w", app_command=["sleep"], sidecar=True, proxy_image="e", annotations=annotations
    )
    [proxy] = [c for c in pod["spec"]["containers"] if c["name"] == "istio-proxy"]
    assert proxy["command"] == [
        "/usr/local/bin/envoy", "--config-path", envoy.IMAGE_TPROXY_BOOTSTRAP, *envoy.IMAGE_FLAGS
    ]  # fmt: skip
    assert proxy["securityContext"] == {
        "runAsUser": 0,
        "runAsGroup": 1337,
        "runAsNonRoot": False,
        "capabilities": {"drop": ["ALL"], "add": ["NET_ADMIN"]},
    }
    redirect = kubepods.pod_manifest("p", "w", app_command=["sleep"], sidecar=True, proxy_image="e")
    [proxy] = [c for c in redirect["spec"]["containers"] if c["name"] == "istio-proxy"]
    assert "command" not in proxy
    assert proxy["securityContext"] == {"runAsUser": 1337, "runAsGroup": 1337}


def test_the_tproxy_bootstrap_is_transparent_with_original_src_inbound() -> None:
    config = envoy.sidecar_config(log_dir=None, tproxy=True)
    listeners = {x["name"]: x for x in config["static_resources"]["listeners"]}
    inbound, outbound = listeners[envoy.INBOUND_LISTENER], listeners[envoy.OUTBOUND_LISTENER]
    assert inbound["transparent"] and outbound["transparent"]
    names = [f["name"] for f in inbound["listener_filters"]]
    assert "envoy.filters.listener.original_src" in names, names
