"""The protocol shell: required variables per command, stdin checks, versions, error objects."""

from __future__ import annotations

import io
import json

import pytest

from plugin import wire
from plugin.commands import Plugin
from plugin.skel import REQUIRED, dispatch, parse_cni_args
from tests.plugin.helpers import VERSIONS, cni_env, net_conf, run_plugin

COMMANDS = ("ADD", "CHECK", "DEL", "GC", "STATUS")


def assert_error(run, code: int, *words: str) -> None:  # type: ignore[no-untyped-def]
    assert run.code == 1, run.raw
    assert set(run.out) == {"cniVersion", "code", "msg", "details"}
    assert run.out["code"] == code, run.out
    for word in words:
        assert word in run.out["msg"] + run.out["details"], run.out


@pytest.mark.parametrize("version", VERSIONS, ids=VERSIONS)
@pytest.mark.parametrize(
    "stdin",
    ["", "{}", '{"cniVersion": "0.0.9"}', "garbage"],
    ids=["empty", "no-version", "unknown-version", "not-json"],
)
def test_version_lists_supported_versions(version: str, stdin: str) -> None:
    run = run_plugin({"CNI_COMMAND": "VERSION"}, stdin or json.dumps({"cniVersion": version}))
    assert run.code == 0
    assert run.out["supportedVersions"] == list(VERSIONS)
    assert run.out["cniVersion"] == (version if not stdin else "1.1.0")


def test_missing_command_names_it_and_prints_about() -> None:
    run = run_plugin({}, net_conf())
    assert_error(run, wire.INVALID_ENV, "CNI_COMMAND")
    assert "istio-cni" in run.err and "0.3.0" in run.err


def test_unknown_command() -> None:
    assert_error(run_plugin(cni_env("FINALIZE"), net_conf()), wire.INVALID_ENV, "FINALIZE")


CASES = [(cmd, var) for cmd in COMMANDS for var in REQUIRED[cmd]]


@pytest.mark.parametrize(("command", "var"), CASES, ids=[f"{c}-{v}" for c, v in CASES])
def test_missing_required_variable(command: str, var: str) -> None:
    env = cni_env(command)
    del env[var]
    run = run_plugin(env, net_conf("1.1.0"))
    assert_error(run, wire.INVALID_ENV, var)


def test_all_missing_variables_named_at_once() -> None:
    run = run_plugin({"CNI_COMMAND": "ADD"}, net_conf())
    assert_error(run, wire.INVALID_ENV, "CNI_CONTAINERID,CNI_NETNS,CNI_IFNAME,CNI_PATH")


def test_del_needs_no_netns(agent) -> None:  # type: ignore[no-untyped-def]
    env = cni_env("DEL")
    del env["CNI_NETNS"]
    run = run_plugin(env, net_conf(run_dir=str(agent.run_dir)))
    assert run.code == 0 and run.out is None
    assert agent.requests[0][2]["netns"] == ""


@pytest.mark.parametrize(
    ("var", "value", "code"),
    [
        ("CNI_CONTAINERID", "-bad", wire.INVALID_ENV),
        ("CNI_CONTAINERID", "a b", wire.INVALID_ENV),
        ("CNI_IFNAME", "a-name-longer-than-15", wire.INVALID_ENV),
        ("CNI_IFNAME", "..", wire.INVALID_ENV),
        ("CNI_IFNAME", "eth/0", wire.INVALID_ENV),
        ("CNI_ARGS", "K8S_POD_NAME", wire.INVALID_ENV),
    ],
    ids=["id-dash", "id-space", "ifname-long", "ifname-dots", "ifname-slash", "args-no-equals"],
)
def test_invalid_variable_values(var: str, value: str, code: int) -> None:
    run = run_plugin(cni_env("ADD", **{var: value}), net_conf(exclude_namespaces=["default"]))
    assert_error(run, code)


@pytest.mark.parametrize("command", COMMANDS, ids=COMMANDS)
@pytest.mark.parametrize(
    ("stdin", "code", "word"),
    [
        (b"", wire.DECODING_FAILURE, "not JSON"),
        (b"{not json", wire.DECODING_FAILURE, "not JSON"),
        (b"\xff\xfe", wire.DECODING_FAILURE, "not JSON"),
        (b"[1, 2]", wire.DECODING_FAILURE, "object"),
        (b'"text"', wire.DECODING_FAILURE, "object"),
        (b'{"cniVersion": "1.1.0", "type": "istio-cni"}', wire.INVALID_CONFIG, "name"),
        (b'{"cniVersion": "1.1.0", "name": "n"}', wire.INVALID_CONFIG, "type"),
        (b'{"cniVersion": 1, "name": "n", "type": "t"}', wire.INVALID_CONFIG, "cniVersion"),
        (b'{"cniVersion": "1.1.0", "name": ["n"], "type": "t"}', wire.INVALID_CONFIG, "name"),
        (b'{"cniVersion": "1.1.0", "name": "n", "type": ""}', wire.INVALID_CONFIG, "type"),
        (b'{"cniVersion": "1.1.0", "name": "-n", "type": "t"}', wire.INVALID_CONFIG, "name"),
        (
            b'{"cniVersion": "9.9.9", "name": "n", "type": "t"}',
            wire.INCOMPATIBLE_VERSION,
            "9.9.9",
        ),
        (
            b'{"cniVersion": "0.0.9", "name": "n", "type": "t"}',
            wire.INCOMPATIBLE_VERSION,
            "0.0.9",
        ),
        (
            b'{"cniVersion": "1.1.0", "name": "n", "type": "t", "prevResult": []}',
            wire.INVALID_CONFIG,
            "prevResult",
        ),
        (
            b'{"cniVersion": "1.1.0", "name": "n", "type": "t", "exclude_namespaces": "a"}',
            wire.INVALID_CONFIG,
            "exclude_namespaces",
        ),
        (
            b'{"cniVersion": "1.1.0", "name": "n", "type": "t", "cni_agent_run_dir": "rel"}',
            wire.INVALID_CONFIG,
            "cni_agent_run_dir",
        ),
        (
            b'{"cniVersion": "1.1.0", "name": "n", "type": "t", "plugin_log_level": "loud"}',
            wire.INVALID_CONFIG,
            "plugin_log_level",
        ),
        (
            b'{"cniVersion": "1.1.0", "name": "n", "type": "t", "agent_timeout_seconds": true}',
            wire.INVALID_CONFIG,
            "agent_timeout_seconds",
        ),
        (
            b'{"cniVersion": "1.1.0", "name": "n", "type": "t", "pod_name": 5}',
            wire.INVALID_CONFIG,
            "pod_name",
        ),
    ],
    ids=[
        "empty",
        "not-json",
        "not-utf8",
        "array",
        "string",
        "no-name",
        "no-type",
        "version-int",
        "name-list",
        "type-empty",
        "name-bad",
        "version-unknown",
        "version-too-old",
        "prev-list",
        "exclude-str",
        "rundir-rel",
        "level-bad",
        "timeout-bool",
        "podname-int",
    ],
)
def test_malformed_config(command: str, stdin: bytes, code: int, word: str) -> None:
    run = run_plugin(cni_env(command), stdin)
    assert_error(run, code, word)


@pytest.mark.parametrize("version", VERSIONS, ids=VERSIONS)
@pytest.mark.parametrize("command", ["CHECK", "GC", "STATUS"])
def test_commands_need_their_spec_version(command: str, version: str, agent) -> None:  # type: ignore[no-untyped-def]
    conf = net_conf(version, str(agent.run_dir), **{"cni.dev/valid-attachments": []})
    run = run_plugin(cni_env(command), conf)
    allowed = {"CHECK": "0.4.0", "GC": "1.1.0", "STATUS": "1.1.0"}[command]
    if tuple(map(int, version.split("."))) >= tuple(map(int, allowed.split("."))):
        assert run.code == 0, run.raw
        assert run.out is None
    else:
        assert_error(run, wire.INCOMPATIBLE_VERSION, command)
        assert run.out["cniVersion"] == version
        assert agent.requests == []


def test_error_object_carries_config_version() -> None:
    run = run_plugin(cni_env("ADD"), net_conf("0.4.0"))
    assert run.out["cniVersion"] == "0.4.0"
    assert run.out["code"] == wire.TRY_AGAIN_LATER


def test_unexpected_exception_becomes_error_999() -> None:
    def boom(args, conf):  # type: ignore[no-untyped-def]
        raise RuntimeError("kaput")

    out, err = io.StringIO(), io.StringIO()
    code = dispatch(
        {"ADD": boom},
        environ=cni_env("ADD"),
        stdin=io.BytesIO(json.dumps(net_conf()).encode()),
        stdout=out,
        stderr=err,
    )
    assert code == 1
    assert json.loads(out.getvalue())["code"] == wire.INTERNAL
    assert "kaput" in json.loads(out.getvalue())["msg"]
    assert "Traceback" in err.getvalue()


def test_stdin_read_failure_is_io_error() -> None:
    class Broken(io.RawIOBase):
        def read(self, size: int = -1) -> bytes:
            raise OSError(5, "Input/output error")

    out = io.StringIO()
    code = dispatch(
        Plugin(stderr=io.StringIO()).commands(),
        environ=cni_env("ADD"),
        stdin=Broken(),  # type: ignore[arg-type]
        stdout=out,
        stderr=io.StringIO(),
    )
    assert code == 1 and json.loads(out.getvalue())["code"] == wire.IO_FAILURE


@pytest.mark.parametrize(
    ("args", "parsed"),
    [
        ("", {}),
        ("IgnoreUnknown=1;K8S_POD_NAME=a", {"IgnoreUnknown": "1", "K8S_POD_NAME": "a"}),
        ("A=b=c;", {"A": "b=c"}),
    ],
    ids=["empty", "k8s", "equals-in-value"],
)
def test_parse_cni_args(args: str, parsed: dict[str, str]) -> None:
    assert parse_cni_args(args) == parsed
