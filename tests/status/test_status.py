"""`istio-cni-agent status`: the report from the pod cache and the outcomes noted, served on the
status socket and printed by the CLI, with its exit codes; hostile pod strings stay escaped.
The pod cache and the rules comparison are test doubles (PodsDouble, compare_double); the
socket, the server and the CLI are real. The node tier (tests/node/test_status.py) runs it all
in the agent's pod."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from agent.metrics import RecentDurations
from agent.pods import states
from agent.pods.states import PodStates
from agent.rules.compare import RulesDiff
from agent.status import cli
from agent.status.report import StatusReport
from agent.status.server import StatusServer
from tests.podserver.helpers import make_pod

HOSTILE = "web\x1b[2J\nFAKE captured"


class PodsDouble:
    def __init__(self, *pods: dict[str, Any]) -> None:
        self.pods = list(pods)

    def list_pods(self) -> list[dict[str, Any]]:
        return self.pods

    def ready(self) -> bool:
        return True


def make(name: str, uid: str, **kw: Any) -> dict[str, Any]:
    return make_pod(name, "app", uid=uid, **kw)


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[tuple[str, PodStates, dict[str, RulesDiff]]]:
    pods = PodsDouble(
        make("captured", "u1"),
        make("plain", "u2", sidecar=False),
        make("refused", "u3"),
        make("ambient", "u4", sidecar=False),
        make("old", "u5"),
        make("differ", "u6"),
    )
    noted = PodStates()
    diffs = {
        "u1": RulesDiff("iptables-nft"),
        "u6": RulesDiff("nftables", missing=("inet t c: redirect \x1b[31m",), extra=("x",)),
    }

    def compare_double(pod: Mapping[str, Any], netns: str, ambient: bool) -> RulesDiff:
        return diffs[pod["metadata"]["uid"]]

    report = StatusReport(
        node_name="node-1",
        pods=pods,
        states=noted,
        decide=lambda p: (len(p["spec"]["containers"]) > 1, "decided"),
        find_netns=lambda ps: {
            p["metadata"]["uid"]: "/run/netns/x" for p in ps if p["metadata"]["uid"] != "u5"
        },
        compare=compare_double,
        ambient_state=lambda uid: "pending" if uid == "u4" else "none",
    )
    note = dict(namespace="app", kind=states.ADD)
    noted.note(name="captured", uid="u1", state=states.CAPTURED, reason="rules applied", **note)
    noted.note(name="refused", uid="u3", state=states.REFUSED, reason=HOSTILE, **note)
    server = StatusServer(str(tmp_path / "status.sock"), report)
    server.start()
    try:
        yield server.path, noted, diffs
    finally:
        server.stop()


def status(path: str, *argv: str) -> tuple[int, str]:
    out = io.StringIO()
    code = cli.main("status", ["--socket", path, *argv], out)
    return code, out.getvalue()


def test_the_listing_names_each_pods_state(rig: Any) -> None:
    path, _, _ = rig
    code, text = status(path)
    assert code == cli.DIFFER  # one pod is refused
    lines = {line.split()[1]: line for line in text.splitlines()[2:]}
    assert lines["captured"].split()[2:4] == ["captured", "-"]
    assert lines["plain"].split()[2] == "skipped" and "decided" in lines["plain"]
    assert lines["refused"].split()[2] == "refused"
    assert lines["ambient"].split()[2:4] == ["ambient-enrolled", "pending"]
    assert lines["old"].split()[2] == "not-seen"
    assert "\x1b" not in text and "\\x1b[2J\\nFAKE captured" in lines["refused"]
    assert len(text.splitlines()) == 2 + 6


def test_one_pods_rules_and_the_exit_codes(rig: Any) -> None:
    path, _, _ = rig
    code, text = status(path, "app/captured")
    assert code == cli.OK, text
    assert "rules (iptables-nft): as this agent would program them now" in text
    code, text = status(path, "differ", "-n", "app")
    assert code == cli.DIFFER, text
    assert "missing:   inet t c: redirect \\x1b[31m" in text and "extra:     x" in text
    assert status(path, "app/gone")[0] == cli.UNKNOWN_POD
    assert status(path, "app/Not_A_Name")[0] == cli.UNKNOWN_POD
    code, text = status(path, "app/old")
    assert code == cli.CANNOT_TELL and "network namespace was not found" in text
    code, text = status(path, "--json", "app/differ")
    assert code == cli.DIFFER and json.loads(text)["rules"]["backend"] == "nftables"


def test_no_agent_is_cannot_tell(tmp_path: Path) -> None:
    assert status(str(tmp_path / "none.sock"))[0] == cli.CANNOT_TELL


def test_help_documents_the_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main("status", ["--help"]) == cli.OK
    shown = capsys.readouterr().out
    for code in (cli.OK, cli.DIFFER, cli.UNKNOWN_POD, cli.CANNOT_TELL):
        assert f"\n  {code}  " in shown


def test_states_keep_the_latest_outcome_and_are_bounded() -> None:
    noted = PodStates(limit=2)
    for i in range(3):
        noted.note(namespace="a", name=f"p{i}", uid=f"u{i}", kind=states.ADD, state="s", reason="r")
    assert len(noted) == 2 and noted.get("u0") is None
    noted.note(namespace="a", name="p2", uid="u2", kind=states.REPAIR, state="repaired", reason="x")
    record = noted.get("u2")
    assert record is not None and set(record.outcomes) == {states.ADD, states.REPAIR}
    noted.note(namespace="a", name="other", uid="u2", kind=states.ADD, state="s", reason="r")
    record = noted.get("u2")
    assert record is not None and set(record.outcomes) == {states.ADD}  # not inherited
    noted.forget_except({"u1"})
    assert noted.get("u2") is None and noted.get("u1") is not None


def test_the_listing_shows_the_recent_adds_p50_and_p99(tmp_path: Path) -> None:
    """From known samples: 1..100 ms, and a slow one, in the window; one older is left out."""
    clock = [1000.0]
    recent = RecentDurations(window=300.0, clock=lambda: clock[0])
    recent.add(60.0)  # before the window
    clock[0] += 301
    for ms in range(1, 100):
        recent.add(ms / 1000)
    recent.add(2.5)
    report = StatusReport(
        node_name="node-1",
        pods=PodsDouble(make("captured", "u1")),
        states=PodStates(),
        decide=lambda p: (True, "decided"),
        find_netns=lambda ps: {},
        compare=lambda pod, netns, ambient: RulesDiff("nftables"),
        add_latency=recent.summary,
    )
    server = StatusServer(str(tmp_path / "status.sock"), report)
    server.start()
    try:
        code, text = status(server.path)
        assert code == cli.OK, text
        assert text.splitlines()[1] == "CNI ADD, last 5 min: 100 answered, p50 50.0 ms, p99 99.0 ms"
        code, text = status(server.path, "--json")
        assert json.loads(text)["addLatency"] == {
            "windowSeconds": 300.0,
            "count": 100,
            "p50Seconds": 0.05,
            "p99Seconds": 0.099,
        }
        clock[0] += 301
        code, text = status(server.path)
        assert text.splitlines()[1] == "CNI ADD, last 5 min: none answered"
    finally:
        server.stop()


@pytest.mark.parametrize(
    "latency",
    [
        {"windowSeconds": "x", "count": "many", "p50Seconds": "\x1b[2J", "p99Seconds": None},
        {"windowSeconds": 300, "count": 3, "p50Seconds": True, "p99Seconds": []},
        {},
        {"windowSeconds": 1e300, "count": 10**400, "p50Seconds": float("nan"), "p99Seconds": 1},
    ],
    ids=["strings", "wrong-types", "empty", "huge"],
)
def test_a_strange_latency_answer_prints_no_escape_and_no_error(latency: dict[str, Any]) -> None:
    line = cli.recent_adds_line(latency)
    assert "\x1b" not in line and line.startswith("CNI ADD, ")
    assert len(line) < 120, line
