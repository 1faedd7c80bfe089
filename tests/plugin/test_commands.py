"""What each command decides locally and what it asks the agent (a test double on a real socket)."""

from __future__ import annotations

import time

import pytest

from plugin import wire
from tests.plugin.helpers import (
    VERSIONS,
    AgentTestDouble,
    Answer,
    cni_env,
    net_conf,
    result_for,
    run_plugin,
)

PASS_CASES = {
    "no-cni-args": "",
    "no-pod-name": "K8S_POD_NAMESPACE=default",
    "no-namespace": "K8S_POD_NAME=app-1",
    "excluded-namespace": "K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME=coredns-1",
    "agent-own-pod": "K8S_POD_NAMESPACE=istio-system;K8S_POD_NAME=istio-cni-node-abcde",
}


@pytest.mark.parametrize("version", VERSIONS, ids=VERSIONS)
@pytest.mark.parametrize("args", PASS_CASES.values(), ids=PASS_CASES.keys())
def test_local_pass_without_agent(args: str, version: str) -> None:
    """These pods pass even with no agent at all: ADD returns prevResult, DEL/CHECK succeed."""
    conf = net_conf(version)  # run dir /nonexistent: no agent
    run = run_plugin(cni_env("ADD", CNI_ARGS=args), conf)
    assert run.code == 0, run.raw
    assert run.out == result_for(version)
    for command in ("DEL", "CHECK") if version >= "0.4.0" else ("DEL",):
        run = run_plugin(cni_env(command, CNI_ARGS=args), conf)
        assert (run.code, run.out) == (0, None), run.raw


def test_same_pod_name_in_other_namespace_is_not_the_agent(agent: AgentTestDouble) -> None:
    args = "K8S_POD_NAMESPACE=default;K8S_POD_NAME=istio-cni-node-abcde"
    run = run_plugin(cni_env("ADD", CNI_ARGS=args), net_conf(run_dir=str(agent.run_dir)))
    assert run.code == 0
    assert agent.paths() == ["/v1/cni/add"]


# CHECK exists since 0.4.0 (test_skel covers its refusal before that).
AGENT_CASES = [
    (c, v) for c in ("ADD", "CHECK", "DEL") for v in VERSIONS if c != "CHECK" or v >= "0.4.0"
]


@pytest.mark.parametrize(
    ("command", "version"), AGENT_CASES, ids=[f"{c}-{v}" for c, v in AGENT_CASES]
)
def test_one_request_to_the_agent(command: str, version: str, agent: AgentTestDouble) -> None:
    conf = net_conf(version, str(agent.run_dir))
    run = run_plugin(cni_env(command), conf)
    assert run.code == 0, run.raw
    assert run.out == (result_for(version) if command == "ADD" else None)
    assert agent.paths() == [f"/v1/cni/{command.lower()}"]
    method, _, body = agent.requests[0]
    assert method == "POST"
    started = body.pop("startedAt")  # this process's start (the plugin runs in the test's)
    assert isinstance(started, float)
    assert 0 < started <= time.clock_gettime(time.CLOCK_BOOTTIME)
    assert body == {
        "command": command,
        "containerId": "c0ffee",
        "netns": "/var/run/netns/x",
        "ifname": "eth0",
        "podName": "app-1",
        "podNamespace": "default",
        "podUid": "uid-1",
        "cniVersion": version,
        "prevResult": result_for(version),
    }


@pytest.mark.parametrize("command", ["ADD", "CHECK", "DEL"])
def test_agent_error_becomes_cni_error(command: str, agent: AgentTestDouble) -> None:
    agent.answers[f"/v1/cni/{command.lower()}"] = Answer(
        500, {"code": 104, "msg": "apply rules failed", "details": "iptables-restore: exit 4"}
    )
    run = run_plugin(cni_env(command), net_conf(run_dir=str(agent.run_dir)))
    assert run.code == 1
    assert run.out == {
        "cniVersion": "1.0.0",
        "code": 104,
        "msg": "apply rules failed",
        "details": "iptables-restore: exit 4",
    }


def test_agent_error_without_cni_body(agent: AgentTestDouble) -> None:
    agent.answers["/v1/cni/add"] = Answer(502, b"<html>bad gateway</html>")
    run = run_plugin(cni_env("ADD"), net_conf(run_dir=str(agent.run_dir)))
    assert run.out["code"] == wire.INTERNAL
    assert "502" in run.out["msg"] and "bad gateway" in run.out["details"]


@pytest.mark.parametrize("command", ["ADD", "CHECK"])
def test_agent_down_fails_closed_with_try_again(command: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    run = run_plugin(cni_env(command), net_conf(run_dir=str(tmp_path)))
    assert run.code == 1
    assert run.out["code"] == wire.TRY_AGAIN_LATER
    assert str(tmp_path / "pluginevent.sock") in run.out["details"]
    assert "level=error" in run.err


def test_agent_socket_refusing_is_try_again(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import socket

    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(tmp_path / "pluginevent.sock"))
    stale.close()  # the file stays, nobody listens: ECONNREFUSED
    run = run_plugin(cni_env("ADD"), net_conf(run_dir=str(tmp_path)))
    assert run.out["code"] == wire.TRY_AGAIN_LATER


def test_agent_timeout_is_try_again(agent: AgentTestDouble) -> None:
    agent.answers["/v1/cni/add"] = Answer(200, {"result": "redirected", "reason": ""}, delay=2)
    conf = net_conf(run_dir=str(agent.run_dir), agent_timeout_seconds=0.3)
    run = run_plugin(cni_env("ADD"), conf)
    assert run.code == 1
    assert run.out["code"] == wire.TRY_AGAIN_LATER
    assert "0.3 s" in run.out["msg"]


def test_del_succeeds_when_agent_down(tmp_path) -> None:  # type: ignore[no-untyped-def]
    run = run_plugin(cni_env("DEL"), net_conf(run_dir=str(tmp_path)))
    assert (run.code, run.out) == (0, None)
    assert "level=warn" in run.err and "without the agent" in run.err


def test_del_is_idempotent(agent: AgentTestDouble) -> None:
    conf = net_conf(run_dir=str(agent.run_dir))
    for _ in range(3):
        assert run_plugin(cni_env("DEL"), conf).code == 0
    assert agent.paths() == ["/v1/cni/del"] * 3


def test_status_ready(agent: AgentTestDouble) -> None:
    run = run_plugin(cni_env("STATUS"), net_conf("1.1.0", str(agent.run_dir)))
    assert (run.code, run.out) == (0, None)
    assert agent.requests[0][:2] == ("GET", "/v1/status")


def test_status_not_ready(agent: AgentTestDouble) -> None:
    agent.answers["/v1/status"] = Answer(503, {"ready": False, "reason": "pod cache not synced"})
    run = run_plugin(cni_env("STATUS"), net_conf("1.1.0", str(agent.run_dir)))
    assert run.out["code"] == wire.NOT_AVAILABLE
    assert run.out["msg"] == "the plugin is not available"
    assert "pod cache not synced" in run.out["details"]


def test_status_agent_down(tmp_path) -> None:  # type: ignore[no-untyped-def]
    run = run_plugin(cni_env("STATUS"), net_conf("1.1.0", str(tmp_path)))
    assert run.out["code"] == wire.NOT_AVAILABLE
    assert "not reachable" in run.out["details"]


@pytest.mark.parametrize("key", ["cni.dev/valid-attachments", "cni.dev/attachments"])
def test_gc_passes_valid_attachments(key: str, agent: AgentTestDouble) -> None:
    conf = net_conf(
        "1.1.0",
        str(agent.run_dir),
        **{key: [{"containerID": "a1", "ifname": "eth0"}, {"containerID": "b2", "ifname": "net1"}]},
    )
    del conf["prevResult"]
    run = run_plugin({"CNI_COMMAND": "GC", "CNI_PATH": "/opt/cni/bin"}, conf)
    assert (run.code, run.out) == (0, None), run.raw
    assert agent.requests[0] == (
        "POST",
        "/v1/cni/gc",
        {
            "validAttachments": [
                {"containerId": "a1", "ifname": "eth0"},
                {"containerId": "b2", "ifname": "net1"},
            ]
        },
    )


@pytest.mark.parametrize(
    "value",
    [None, "a1", [{"containerID": "a1"}], [["a1", "eth0"]]],
    ids=["missing", "string", "no-ifname", "pair-list"],
)
def test_gc_rejects_bad_attachments(value: object, agent: AgentTestDouble) -> None:
    conf = net_conf("1.1.0", str(agent.run_dir))
    if value is not None:
        conf["cni.dev/valid-attachments"] = value
    run = run_plugin(cni_env("GC"), conf)
    assert run.out["code"] == wire.INVALID_CONFIG
    assert "valid-attachments" in run.out["msg"]
    assert agent.requests == []


def test_gc_agent_down_is_try_again(tmp_path) -> None:  # type: ignore[no-untyped-def]
    conf = net_conf("1.1.0", str(tmp_path), **{"cni.dev/valid-attachments": []})
    assert run_plugin(cni_env("GC"), conf).out["code"] == wire.TRY_AGAIN_LATER


def test_log_lines_reach_the_agent_with_the_pod(agent: AgentTestDouble) -> None:
    run = run_plugin(cni_env("ADD"), net_conf(run_dir=str(agent.run_dir)))
    assert run.code == 0
    logs = agent.logs()
    assert logs and logs[0]["podName"] == "app-1" and logs[0]["podNamespace"] == "default"
    assert logs[0]["containerId"] == "c0ffee" and logs[0]["level"] == "debug"
    assert "ADD: redirected" in logs[0]["msg"]
    assert "pod=default/app-1" in run.err


def test_log_level_filters_lines(agent: AgentTestDouble) -> None:
    conf = net_conf(run_dir=str(agent.run_dir), plugin_log_level="info")
    run = run_plugin(cni_env("ADD"), conf)
    assert run.code == 0 and run.err == "" and agent.logs() == []
