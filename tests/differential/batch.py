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
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )
    text = out.read_text() if out.exists() else ""
    lines = [line for line in text.splitlines() if line.split(" ", 1)[0] not in ISTIO_COMMANDS]
    errors = [line for line in proc.stderr.splitlines() + proc.stdout.splitlines()
              if "error" in line.lower()]
    return {"rc": proc.returncode, "lines": lines, "error": "\n".join(errors[-3:])}


def run_ours(case: dict[str, Any]) -> dict[str, Any]:
    out, err = io.StringIO(), io.StringIO()
    env = {**BASE_ENV, **case["env"]}
    with redirect_stdout(out), redirect_stderr(err):
        rc = rules_main("rules", list(case["argv"]), env)
    return {"rc": rc, "lines": out.getvalue().splitlines(), "error": err.getvalue().strip()}


def main(spec_path: str, out_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    with tempfile.TemporaryDirectory(prefix="istio-diff-") as tmp:
        scratch = Path(tmp)
        set_up_host(spec["host"]["links"], spec["host"]["resolv_conf"], scratch)
        cases = spec["cases"]
        # Istio's runs are processes: overlap them; ours run in this process, one at a time.
        with ThreadPoolExecutor(max_workers=spec.get("workers", 3)) as pool:
            istio = list(pool.map(lambda c: run_istio(spec["pilot_agent"], c, scratch), cases))
        ours = [run_ours(case) for case in cases]
    results = [{"index": c["index"], "istio": i, "ours": o}
               for c, i, o in zip(cases, istio, ours, strict=True)]
    Path(out_path).write_text(json.dumps(results))
    return 0


if __name__ == "__main__":
    os.umask(0o022)
    sys.exit(main(sys.argv[1], sys.argv[2]))
