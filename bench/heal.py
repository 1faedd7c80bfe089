"""Time to heal: from another writer's change to our entry (or binary) being back.

Runs `istio-cni-agent run` as a real process on temp bin/conf dirs, then repeatedly breaks the
install in one of three ways and polls (every 0.2 ms) until it is whole again:
  rename    the conflist replaced atomically without our entry (what most CNIs do)
  in-place  the conflist truncated and rewritten without our entry
  binary    the plugin binary deleted
Prints p50/p99/max per kind and overall.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from testbed.ports import free_port

REPO = pathlib.Path(__file__).resolve().parents[1]
LIST = {
    "cniVersion": "0.3.1",
    "name": "k8s-pod-network",
    "plugins": [
        {"type": "calico", "ipam": {"type": "calico-ipam"}},
        {"type": "portmap", "capabilities": {"portMappings": True}},
    ],
}


def _has_entry(path: pathlib.Path) -> bool:
    try:
        plugins = json.loads(path.read_bytes())["plugins"]
    except (OSError, ValueError, KeyError):
        return False
    return any(p.get("type") == "istio-cni" for p in plugins)


def _wait(condition: object, timeout: float = 10.0) -> float:
    start = time.monotonic()
    while not condition():  # type: ignore[operator]
        if time.monotonic() - start > timeout:
            raise SystemExit("not healed within 10 s")
        time.sleep(0.0002)
    return time.monotonic()


def _break(kind: str, conf: pathlib.Path, plugin: pathlib.Path, gen: int) -> None:
    config = json.loads(json.dumps(LIST))
    config["plugins"][0]["generation"] = gen
    data = json.dumps(config, indent=2).encode()
    if kind == "rename":
        tmp = conf.with_name(conf.name + ".other-cni-tmp")
        tmp.write_bytes(data)
        os.replace(tmp, conf)
    elif kind == "in-place":
        with open(conf, "wb") as f:
            f.write(data)
    else:
        plugin.unlink()


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=240, help="total breakages (>= 200)")
    parser.add_argument("--pause", type=float, default=0.1, help="seconds between breakages")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        for d in ("bin", "conf", "src"):
            (root / d).mkdir()
        plugin_src = root / "src" / "istio-cni"
        plugin_src.write_text("#!/bin/sh\necho '{}'\n")
        plugin_src.chmod(0o755)
        conf = root / "conf" / "10-calico.conflist"
        conf.write_text(json.dumps(LIST))
        config = root / "config.yaml"
        config.write_text(
            f"mountedCniBinDir: {root / 'bin'}\nmountedCniConfDir: {root / 'conf'}\n"
            f"pluginSourceDir: {root / 'src'}\nmetricsAddress: 127.0.0.1\n"
            f"metricsPort: {free_port()}\nuninstallOnStop: always\nlogLevel: warn\n"
            "conflictsPerMinuteWarning: 100000\n"
        )
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "POD_NAME": "bench",
            "POD_NAMESPACE": "istio-system",
        }
        with open(root / "agent.log", "wb") as log:
            agent = subprocess.Popen(
                [sys.executable, "-m", "agent.cli", "run", "--config", str(config)],
                env=env,
                stdout=log,
                stderr=log,
            )
        try:
            plugin = root / "bin" / "istio-cni"
            _wait(lambda: _has_entry(conf) and plugin.exists(), timeout=30)
            time.sleep(0.5)
            kinds = ("rename", "in-place", "binary")
            samples: dict[str, list[float]] = {k: [] for k in kinds}
            for i in range(args.events):
                kind = kinds[i % 3]
                start = time.monotonic()
                _break(kind, conf, plugin, i)
                healed = plugin.exists if kind == "binary" else (lambda: _has_entry(conf))
                end = _wait(healed)
                samples[kind].append((end - start) * 1000)
                time.sleep(args.pause)
        finally:
            agent.send_signal(signal.SIGTERM)
            agent.wait(timeout=30)
    every = [v for values in samples.values() for v in values]
    print(f"{'kind':<10} {'n':>4} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'mean ms':>8}")
    for name, values in [*samples.items(), ("all", every)]:
        print(
            f"{name:<10} {len(values):>4} {_pct(values, 0.5):>8.1f} {_pct(values, 0.99):>8.1f}"
            f" {max(values):>8.1f} {statistics.fmean(values):>8.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
