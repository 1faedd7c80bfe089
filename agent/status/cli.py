"""`istio-cni-agent status [NAMESPACE/POD]`: ask the running agent of this node (its status
socket) what it did to its pods, or how one pod's rules compare with what it would program.

Run it in the agent's pod: `kubectl -n kube-system exec AGENT_POD -- istio-cni-agent status`.
What the agent answers is read at most MAX_REPLY bytes and every string printed escaped again
(the agent does too): pod names, reasons and the rules in a pod's namespace are the pod owner's.
"""

from __future__ import annotations

import argparse
import http.client
import io
import json
import socket
import sys
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from agent.config import DEFAULT_CONFIG_PATH, load_settings
from agent.errors import ConfigError
from agent.excerpt import bounded
from agent.status.server import PODS, socket_path

MAX_REPLY = 8 << 20
TIMEOUT = 30.0

OK, DIFFER, USAGE, UNKNOWN_POD, CANNOT_TELL = 0, 1, 2, 3, 4
NOT_AS_EXPECTED = ("refused", "repair-failed", "rules-differ")

EPILOG = f"""\
exit codes:
  {OK}  as expected: the pods were listed and none is refused, failed repair or differs; for
     POD, the rules in its network namespace are those the agent would program now
  {DIFFER}  the listed pods include one refused, failed repair or differing; for POD, rules
     are missing, extra or in another order (each one named)
  {USAGE}  usage error
  {UNKNOWN_POD}  POD is not on this node
  {CANNOT_TELL}  cannot tell: the agent's socket does not answer, the pod's network namespace
     was not found, or its rules could not be read
"""


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=TIMEOUT)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(TIMEOUT)
            sock.connect(self._path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


def query(path: str, target: str) -> tuple[int, dict[str, Any]]:
    """GET `target` on the socket at `path`: (status, JSON object). OSError when unreachable."""
    conn = _UnixConnection(path)
    try:
        conn.request("GET", target)
        response = conn.getresponse()
        body = response.read(MAX_REPLY + 1)
    except http.client.HTTPException as e:
        raise OSError(f"bad answer: {e}") from e
    finally:
        conn.close()
    if len(body) > MAX_REPLY:
        raise OSError(f"answer longer than {MAX_REPLY} bytes")
    try:
        data = json.loads(body)
    except ValueError as e:
        raise OSError(f"answer is not JSON: {e}") from e
    if not isinstance(data, dict):
        raise OSError("answer is not a JSON object")
    return response.status, data


def show(value: object, limit: int = 1024) -> str:
    return bounded(str(value), limit)  # the agent escaped it reversibly; escapes stay readable


def print_listing(data: Mapping[str, Any], out: TextIO) -> int:
    pods = [p for p in data.get("pods") or [] if isinstance(p, Mapping)]
    rows: list[list[str]] = [["NAMESPACE", "POD", "STATE", "ZTUNNEL", "REASON"]]
    for p in pods:
        fields = ("namespace", "name", "state", "ztunnel", "reason")
        rows.append([show(p.get(f) or "-", 253 if f != "reason" else 512) for f in fields])
    widths = [min(63, max(len(r[i]) for r in rows)) for i in range(4)]
    out.write(f"node {show(data.get('node'), 253)}: {len(pods)} pods\n")
    latency = data.get("addLatency")
    if isinstance(latency, Mapping):
        out.write(recent_adds_line(latency) + "\n")
    if data.get("cacheSynced") is False:
        out.write("(the agent's pod cache has not listed the node's pods yet)\n")
    for row in rows:
        out.write("  ".join(c.ljust(w) for c, w in zip(row[:4], widths, strict=True)))
        out.write(f"  {row[4]}\n")
    if data.get("omitted"):
        out.write(f"... and {show(data['omitted'], 20)} more pods not shown\n")
    bad = [p for p in pods if p.get("state") in NOT_AS_EXPECTED]
    return DIFFER if bad else OK


def _ms(value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "-"
    return f"{value * 1000:.1f} ms"


def recent_adds_line(latency: Mapping[str, Any]) -> str:
    """`CNI ADD, last 5 min: 42 answered, p50 12.3 ms, p99 87.0 ms`."""
    window = latency.get("windowSeconds")
    span = (
        f"last {show(f'{window / 60:g}', 20)} min"
        if isinstance(window, int | float) and not isinstance(window, bool)
        else "recently"
    )
    count = latency.get("count")
    if not isinstance(count, int) or isinstance(count, bool) or count <= 0:
        return f"CNI ADD, {span}: none answered"
    p50, p99 = _ms(latency.get("p50Seconds")), _ms(latency.get("p99Seconds"))
    return f"CNI ADD, {span}: {show(count, 20)} answered, p50 {p50}, p99 {p99}"


def print_detail(status: int, data: Mapping[str, Any], out: TextIO) -> int:
    if status == 404:
        out.write(show(data.get("error") or "pod not on this node") + "\n")
        return UNKNOWN_POD
    pod = data.get("pod") if isinstance(data.get("pod"), Mapping) else {}
    assert isinstance(pod, Mapping)
    out.write(
        f"pod {show(pod.get('namespace'), 253)}/{show(pod.get('name'), 253)} "
        f"(uid {show(pod.get('uid'), 64)}) on node {show(data.get('node'), 253)}\n"
        f"state: {show(pod.get('state'), 64)}: {show(pod.get('reason'))}\n"
    )
    if pod.get("ztunnel"):
        out.write(f"ztunnel: {show(pod.get('ztunnel'), 16)}\n")
    if data.get("netns"):
        out.write(f"netns: {show(data.get('netns'))}\n")
    if data.get("error"):
        out.write(f"cannot compare its rules: {show(data['error'])}\n")
        return CANNOT_TELL
    rules = data.get("rules")
    if not isinstance(rules, Mapping):
        out.write("rules: none (no network namespace of its own)\n")
        return OK
    return _print_rules(rules, out)


def _print_rules(rules: Mapping[str, Any], out: TextIO) -> int:
    backend = show(rules.get("backend"), 64)
    groups = {k: [show(x) for x in rules.get(k) or []] for k in ("missing", "extra", "reordered")}
    if not any(groups.values()):
        out.write(f"rules ({backend}): as this agent would program them now\n")
        return OK
    counts = ", ".join(f"{len(v)} {k}" for k, v in groups.items() if v)
    out.write(f"rules ({backend}): differ from what this agent would program now: {counts}\n")
    for line in groups["missing"]:
        out.write(f"  missing:   {line}\n")
    for line in groups["extra"]:
        out.write(f"  extra:     {line}\n")
    for line in groups["reordered"]:
        out.write(f"  reordered: {line}\n")
    if rules.get("omitted"):
        out.write(f"  ... and {show(rules['omitted'], 20)} more rules not shown\n")
    return DIFFER


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="istio-cni-agent status",
        description="List this node's pods with what the agent did to them (captured, skipped "
        "and why, refused and why, repaired, ambient enrolled, ztunnel acked); with POD, compare "
        "the rules in the pod's network namespace with what the agent would program now.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("pod", nargs="?", help="NAMESPACE/NAME, or NAME with --namespace")
    parser.add_argument("-n", "--namespace", default="default", help="the pod's namespace")
    parser.add_argument("--config", default=DEFAULT_CONFIG_PATH, help="the agent's config file")
    parser.add_argument("--socket", help="the status socket (default: in cniAgentRunDir)")
    parser.add_argument("--json", action="store_true", help="print the agent's answer as JSON")
    return parser


def main(command: str, argv: Sequence[str], out: TextIO = sys.stdout) -> int:
    try:
        args = _parser().parse_args(list(argv))
    except SystemExit as e:
        return OK if e.code == 0 else USAGE
    try:
        path = args.socket or socket_path(load_settings(args.config).cniAgentRunDir)
    except ConfigError as e:
        sys.stderr.write(f"istio-cni-agent status: {e}\n")
        return USAGE
    target = PODS
    if args.pod:
        namespace, _, name = args.pod.rpartition("/")
        target = f"{PODS}/{namespace or args.namespace}/{name}"
    try:
        status, data = query(path, target)
    except OSError as e:
        sys.stderr.write(f"istio-cni-agent status: cannot ask the agent at {path}: {e}\n")
        return CANNOT_TELL
    if args.json:
        out.write(json.dumps(data, indent=2, ensure_ascii=True) + "\n")
    if status == 404 and not args.pod:
        sys.stderr.write(f"istio-cni-agent status: {show(data.get('error'))}\n")
        return CANNOT_TELL
    shown: TextIO = io.StringIO() if args.json else out  # --json: the exit code only
    if args.pod:
        return print_detail(status, data, shown)
    return print_listing(data, shown)
