"""Run a batch of cases through Istio's istio-iptables and our `rules`, inside one namespace.

Started by tests/differential/runner.py as
`unshare --net --mount python -m tests.differential.batch SPEC OUT`: it gives the fresh network
namespace the host's addresses, bind-mounts the host's resolv.conf over /etc/resolv.conf (the
mount namespace is private, so the real one is untouched), then runs every case with both tools
and writes what each printed to OUT (JSON).
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

from agent.rules.cli import main as rules_main

ISTIO_COMMANDS = {"iptables-save", "ip6tables-save", "iptables", "ip6tables"}
"""Lines of Istio's dry-run file that log a command instead of iptables-restore input."""

BASE_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root"}


def set_up_host(links: list[list[Any]], resolv_conf: str, scratch: Path) -> None:
    commands = ["link set lo up"]
    for name, addresses in links:
        if name != "lo":
            # A veth end (no dummy module in every kernel); its peer stays down, addressless.
            commands += [f"link add {name} type veth peer name p-{name}", f"link set {name} up"]
        for address in addresses:
            nodad = " nodad" if ":" in address else ""
            commands.append(f"addr add {address} dev {name}{nodad}")
    subprocess.run(["ip", "-batch", "-"], input="\n".join(commands) + "\n", text=True, check=True)
    resolv = scratch / "resolv.conf"
    resolv.write_text(resolv_conf)
    subprocess.run(["mount", "--bind", str(resolv), "/etc/resolv.conf"], check=True)


def run_istio(pilot_agent: str, case: dict[str, Any], scratch: Path) -> dict[str, Any]:
    out = scratch / f"istio-{case['index']}.txt"
    env = {**BASE_ENV, **case["env"], "DRY_RUN_FILE_PATH": str(out)}
    proc = subprocess.run(
        [pilot_agent, "istio-iptables", *case["argv"]],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    text = out.read_text() if out.exists() else ""
    lines = [line for line in text.splitlines() if line.split(" ", 1)[0] not in ISTIO_COMMANDS]
    errors = [
        line
        for line in proc.stderr.splitlines() + proc.stdout.splitlines()
        if "error" in line.lower()
    ]
    return {"rc": proc.returncode, "lines": lines, "error": "\n".join(errors[-3:])}


def run_ours(case: dict[str, Any]) -> dict[str, Any]:
    out, err = io.StringIO(), io.StringIO()
    env = {**BASE_ENV, **case["env"]}
    with redirect_stdout(out), redirect_stderr(err):
        rc = rules_main("rules", list(case["argv"]), env)
    return {"rc": rc, "lines": out.getvalue().splitlines(), "error": err.getvalue().strip()}


PROGRAMMED = "\tnftables rules programmed:"
"""Istio's log line before the nftables transaction it ran (native mode ignores --dry-run:
it programs this namespace, and logs what it ran)."""
COUNTERS = re.compile(r"\bcounter packets \d+ bytes \d+")


def _nft(args: list[str], stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["nft", *args], input=stdin, capture_output=True, text=True, timeout=60, check=False
    )


def _ruleset() -> str:
    return COUNTERS.sub("counter", _nft(["list", "ruleset"]).stdout)


def logged_transaction(output: str) -> list[str]:
    """The commands Istio logged after "nftables rules programmed:" (up to its blank line)."""
    lines = output.splitlines()
    for i, line in enumerate(lines):
        if line.endswith(PROGRAMMED):
            rest = lines[i + 1 :]
            end = next((j for j, text in enumerate(rest) if not text.strip()), len(rest))
            return rest[:end]
    return []


def run_istio_native(pilot_agent: str, case: dict[str, Any]) -> dict[str, Any]:
    _nft(["flush", "ruleset"])
    proc = subprocess.run(
        [pilot_agent, "istio-iptables", *case["argv"]],
        env={**BASE_ENV, **case["env"]},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    output = proc.stdout + "\n" + proc.stderr
    errors = [line for line in output.splitlines() if "error" in line.lower()]
    return {
        "rc": proc.returncode,
        "lines": logged_transaction(output),
        "ruleset": _ruleset(),
        "error": "\n".join(errors[-3:]),
    }


def run_ours_native(case: dict[str, Any]) -> dict[str, Any]:
    """Our `rules` output, then applied with `nft -f` as our backend would: nft refusing it
    counts as our failure (Istio fails there too, with the same rules)."""
    result = run_ours(case)
    _nft(["flush", "ruleset"])
    if result["rc"] == 0 and result["lines"]:
        done = _nft(["-f", "-"], "\n".join(result["lines"]) + "\n")
        if done.returncode != 0:
            result["rc"] = "nft"
            result["error"] = done.stderr.strip()[-500:]
    result["ruleset"] = _ruleset()
    return result


def main(spec_path: str, out_path: str) -> int:
    if os.stat("/proc/self/ns/net").st_ino == os.stat(f"/proc/{os.getppid()}/ns/net").st_ino:
        # It rewrites addresses, resolv.conf and (native mode) flushes the ruleset.
        sys.stderr.write("differential batch: run me in a new network namespace (runner.py)\n")
        return 2
    spec = json.loads(Path(spec_path).read_text())
    with tempfile.TemporaryDirectory(prefix="istio-diff-") as tmp:
        scratch = Path(tmp)
        set_up_host(spec["host"]["links"], spec["host"]["resolv_conf"], scratch)
        cases = spec["cases"]
        if spec.get("native"):
            # Both program this namespace: one case at a time, each from an empty ruleset.
            istio = [run_istio_native(spec["pilot_agent"], case) for case in cases]
            ours = [run_ours_native(case) for case in cases]
            _write(out_path, cases, istio, ours)
            return 0
        # Istio's runs are processes: overlap them; ours run in this process, one at a time.
        with ThreadPoolExecutor(max_workers=spec.get("workers", 3)) as pool:
            istio = list(pool.map(lambda c: run_istio(spec["pilot_agent"], c, scratch), cases))
        ours = [run_ours(case) for case in cases]
    _write(out_path, cases, istio, ours)
    return 0


def _write(
    out_path: str,
    cases: list[dict[str, Any]],
    istio: list[dict[str, Any]],
    ours: list[dict[str, Any]],
) -> None:
    results = [
        {"index": c["index"], "istio": i, "ours": o}
        for c, i, o in zip(cases, istio, ours, strict=True)
    ]
    Path(out_path).write_text(json.dumps(results))


if __name__ == "__main__":
    os.umask(0o022)
    sys.exit(main(sys.argv[1], sys.argv[2]))
