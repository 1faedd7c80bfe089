"""The plugin's CNI input: the environment (CNI_COMMAND, CNI_CONTAINERID, CNI_NETNS, CNI_IFNAME,
CNI_ARGS, CNI_PATH) and the network config on stdin, as the runtime hands them, through
`plugin.skel.dispatch` with the real commands. The agent is a stand-in answering from the input
(never a socket), and the run dir's log file is not written, so nothing leaves the process.

Contract: exit code 0 or 1; stdout one JSON object (a result, or an error with an integer `code`
and a `msg`); never the catch-all "internal error" an unexpected exception becomes."""

from __future__ import annotations

import io
import json
from typing import Any

import atheris

from bench.doors.finding import Finding
from plugin import commands, log, wire
from plugin.client import AgentUnavailable
from plugin.commands import Plugin
from plugin.skel import dispatch

COMMANDS = ["ADD", "DEL", "CHECK", "GC", "STATUS", "VERSION", "", "add", "ADD\x00"]
CONF = {
    "cniVersion": "1.0.0",
    "name": "k8s-pod-network",
    "type": "istio-cni",
    "agent_run_dir": "/var/run/istio-cni",
    "exclude_namespaces": ["kube-system"],
    "prevResult": {
        "cniVersion": "1.0.0",
        "interfaces": [{"name": "eth0", "sandbox": "/var/run/netns/x"}],
        "ips": [{"address": "10.1.0.5/24", "interface": 0}],
    },
}
SEEDS = [
    json.dumps(CONF).encode(),
    json.dumps({**CONF, "cniVersion": "0.3.1"}).encode(),
    json.dumps({**CONF, "prevResult": None}).encode(),
    b'{"cniVersion":"1.1.0","name":"n","type":"istio-cni"}',
]


class _Agent:
    """Stands in for AgentClient: answers from the fuzzer's bytes, never opens a socket."""

    script: atheris.FuzzedDataProvider | None = None

    def __init__(self, run_dir: str, *, timeout: float, limit: int = wire.MAX_BODY) -> None:
        self.run_dir = run_dir

    def _reply(self) -> Any:
        script = _Agent.script
        if script is None or script.ConsumeBool():
            raise AgentUnavailable("stand-in agent away")
        return wire.reply(
            script.PickValueInList(["redirected", "skipped", "repaired"]),
            script.ConsumeUnicodeNoSurrogates(40),
        )

    def cni(self, command: str, body: Any) -> Any:
        return self._reply()

    def gc(self, body: Any) -> Any:
        return self._reply()

    def log(self, body: Any) -> bool:
        return False

    def status(self) -> Any:
        self._reply()
        return wire.status_reply(True)


def setup() -> None:
    commands.AgentClient = _Agent  # type: ignore[misc,assignment,attr-defined]
    log.append_line = lambda run_dir, line: True  # type: ignore[assignment]


def teardown() -> None:
    pass


def one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    environ = {
        "CNI_COMMAND": fdp.PickValueInList(COMMANDS),
        "CNI_CONTAINERID": fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 80)),
        "CNI_NETNS": fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 60)),
        "CNI_IFNAME": fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 20)),
        "CNI_ARGS": fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 200)),
        "CNI_PATH": "/opt/cni/bin",
    }
    _Agent.script = atheris.FuzzedDataProvider(fdp.ConsumeBytes(16))
    stdin = fdp.ConsumeBytes(fdp.remaining_bytes())
    stdout, stderr = io.StringIO(), io.StringIO()
    code = dispatch(
        Plugin(stderr=stderr).commands(),
        environ=environ,
        stdin=io.BytesIO(stdin),
        stdout=stdout,
        stderr=stderr,
    )
    judge(code, stdout.getvalue())


def judge(code: int, out: str) -> None:
    if code not in (0, 1):
        raise Finding(f"exit code {code}")
    if not out.strip():
        if code == 1:
            raise Finding("failed without an error object on stdout")
        return
    try:
        obj = json.loads(out)
    except ValueError as e:
        raise Finding(f"stdout is not JSON: {out[:200]!r}") from e
    if code == 1:
        if not isinstance(obj, dict) or not isinstance(obj.get("code"), int) or "msg" not in obj:
            raise Finding(f"error object without code and msg: {out[:200]!r}")
        if str(obj["msg"]).startswith("internal error"):
            raise Finding(f"an unexpected exception reached the runtime: {obj}")
