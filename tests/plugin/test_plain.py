"""With the agent unreachable, an ADD passes a plain pod of a sidecar-only install and nothing else
(plugin/plain.py), through the whole plugin: stdin, CNI_ARGS, a socket nobody serves."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from plugin import wire
from tests.plugin.helpers import (
    AgentTestDouble,
    Answer,
    cni_env,
    net_conf,
    result_for,
    run_plugin,
)

KEY = "io.kubernetes.cri.pod-annotations"
PLAIN = {"kubernetes.io/config.seen": "2026-01-01T00:00:00Z", "app": "web"}


def conf_with(run_dir: Path, annotations: Any = PLAIN, **extra: Any) -> dict[str, Any]:
    """Our entry (ambient off) as libcni hands it: runtimeConfig holding `annotations`."""
    fields: dict[str, Any] = {"ambient_enabled": False, **extra}
    if annotations is not None:
        fields["runtimeConfig"] = {KEY: annotations}
    return net_conf(run_dir=str(run_dir), **fields)


@pytest.mark.parametrize("annotations", [PLAIN, {}], ids=["plain", "no-annotations"])
def test_plain_pod_passes_without_the_agent(annotations: Any, tmp_path: Path) -> None:
    run = run_plugin(cni_env("ADD"), conf_with(tmp_path, annotations))
    assert run.code == 0, run.raw
    assert run.out == result_for("1.0.0")
    assert "level=warn" in run.err and "plain pod without the agent" in run.err


MESHED = {
    "status": {"sidecar.istio.io/status": '{"containers":["istio-proxy"]}'},
    "inject": {"sidecar.istio.io/inject": "true"},
    "traffic": {"traffic.sidecar.istio.io/includeOutboundIPRanges": "*"},
    "interception": {"sidecar.istio.io/interceptionMode": "TPROXY"},
    "kubevirt": {"traffic.sidecar.istio.io/kubevirtInterfaces": "net1"},
    "reroute": {"istio.io/reroute-virtual-interfaces": "net1"},
    "ambient": {"ambient.istio.io/redirection": "enabled"},
    "proxy-config": {"proxy.istio.io/config": "{}"},
    "upper-case": {"Sidecar.Istio.io/Status": "x"},
}


@pytest.mark.parametrize("annotations", MESHED.values(), ids=MESHED.keys())
def test_pod_with_istio_annotations_fails_closed(annotations: Any, tmp_path: Path) -> None:
    run = run_plugin(cni_env("ADD"), conf_with(tmp_path, {**PLAIN, **annotations}))
    assert run.code == 1
    assert run.out["code"] == wire.TRY_AGAIN_LATER
    assert "level=error" in run.err


HOSTILE = {
    "list": ["sidecar.istio.io/status"],
    "string": "sidecar.istio.io/status=x",
    "number": 1,
    "true": True,
    "number-value": {"a": 1},
    "null-value": {"a": None},
    "object-value": {"a": {"b": "c"}},
    "list-value": {"a": ["b"]},
    "too-large": {f"k{i}": "v" * 1024 for i in range(257)},
    "one-huge-value": {"a": "v" * (256 * 1024)},
}


@pytest.mark.parametrize("annotations", HOSTILE.values(), ids=HOSTILE.keys())
def test_annotations_that_cannot_be_judged_fail_closed(annotations: Any, tmp_path: Path) -> None:
    run = run_plugin(cni_env("ADD"), conf_with(tmp_path, annotations))
    assert run.code == 1
    assert run.out["code"] == wire.TRY_AGAIN_LATER


NOT_SIDECAR_ONLY = {
    "ambient-on": {"ambient_enabled": True},
    "ambient-not-said": {"ambient_enabled": None},
    "ambient-a-string": {"ambient_enabled": "false"},
}


@pytest.mark.parametrize("fields", NOT_SIDECAR_ONLY.values(), ids=NOT_SIDECAR_ONLY.keys())
def test_an_install_that_may_be_ambient_fails_closed(fields: Any, tmp_path: Path) -> None:
    conf = conf_with(tmp_path)
    conf.update(fields)
    if conf["ambient_enabled"] is None:
        del conf["ambient_enabled"]  # an older entry, written without the field
    run = run_plugin(cni_env("ADD"), conf)
    assert run.code == 1
    assert run.out["code"] == wire.TRY_AGAIN_LATER


RUNTIMES: dict[str, Any] = {
    "no-runtime-config": None,  # an old runtime, or an entry without the capability
    "runtime-config-not-an-object": "x",
    "other-capability-only": {"portMappings": []},
}


@pytest.mark.parametrize("runtime_config", RUNTIMES.values(), ids=RUNTIMES.keys())
def test_annotations_not_handed_fail_closed(runtime_config: Any, tmp_path: Path) -> None:
    conf = conf_with(tmp_path, None)
    if runtime_config is not None:
        conf["runtimeConfig"] = runtime_config
    run = run_plugin(cni_env("ADD"), conf)
    assert run.code == 1
    assert run.out["code"] == wire.TRY_AGAIN_LATER


def test_check_follows_the_same_rule(tmp_path: Path) -> None:
    """CRI-O checks a sandbox's network right after its ADD: a plain pod's CHECK passes too,
    a meshed pod's fails closed."""
    run = run_plugin(cni_env("CHECK"), conf_with(tmp_path))
    assert run.code == 0, run.raw
    assert "CHECK passes a plain pod without the agent" in run.err
    run = run_plugin(cni_env("CHECK"), conf_with(tmp_path, {**PLAIN, **MESHED["status"]}))
    assert run.code == 1
    assert run.out["code"] == wire.TRY_AGAIN_LATER


def test_a_timed_out_agent_counts_as_unreachable(agent: AgentTestDouble) -> None:
    agent.answers["/v1/cni/add"] = Answer(200, {"result": "skipped", "reason": ""}, delay=2)
    conf = conf_with(agent.run_dir, agent_timeout_seconds=0.3)
    run = run_plugin(cni_env("ADD"), conf)
    assert run.code == 0, run.raw
    assert run.out == result_for("1.0.0")


def test_an_agent_that_answers_is_never_overruled(agent: AgentTestDouble) -> None:
    """Only an agent that cannot be reached is replaced: its refusal of a plain pod stands."""
    agent.answers["/v1/cni/add"] = Answer(
        500, {"code": wire.INTERNAL, "msg": "cannot read the pod", "details": ""}
    )
    run = run_plugin(cni_env("ADD"), conf_with(agent.run_dir))
    assert run.code == 1
    assert run.out["code"] == wire.INTERNAL
