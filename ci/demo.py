"""The live demonstration behind `ci/demo`: the chart installed into a real kube-apiserver,
the agent run as its DaemonSet would for a simulated node, pods started through a real CNI chain,
and a connection from a sidecar pod delivered to the proxy port by the rules the agent programmed.

Everything runs on this machine, on loopback and in network namespaces made here; nothing is
left behind, also on failure, Ctrl-C or SIGTERM. Run from the repository root as root:
`python -m ci.demo` (ci/demo first installs or reuses the prerequisites, then runs this with the
project's virtualenv). Exit code 0 when every step passed, 1 naming the step that failed, 130
when interrupted.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import TextIO

from ci.demo_steps import Console, Demo
from tests.testbed import netns

STEPS: list[tuple[str, Callable[[Demo], None]]] = [
    ("Start the control plane", Demo.start_control_plane),
    ("Register a simulated node", Demo.register_node),
    ("Give the node a CNI network: bridge + host-local + portmap", Demo.prepare_node),
    ("Build the plugin the image ships", Demo.build_plugin),
    ("helm install the chart", Demo.helm_install),
    ("Run the agent as the DaemonSet would", Demo.start_agent),
    ("Show the node's CNI config", Demo.show_conflist),
    ("Start a sidecar pod through the CNI chain", Demo.start_sidecar_pod),
    ("Start two pods that must not be captured", Demo.start_plain_pods),
    ("Open a connection from a pod to an outside address", Demo.show_redirect),
    ("helm uninstall, then stop the agent", Demo.uninstall),
]


class Interrupted(Exception):
    """Ctrl-C or SIGTERM: stop the steps at once and clean up."""


@contextmanager
def interrupts_raise() -> Iterator[None]:
    """Ctrl-C and SIGTERM raise Interrupted while the steps run, and are ignored afterwards so
    that a second Ctrl-C cannot cut the cleanup short."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise Interrupted(signal.Signals(signum).name)

    signals = (signal.SIGINT, signal.SIGTERM)
    for s in signals:
        signal.signal(s, handler)
    try:
        yield
    finally:
        for s in signals:
            signal.signal(s, signal.SIG_IGN)


def run(out: TextIO) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="istio-cni-demo."))
    console = Console(out, workdir / "demo.log")
    demo = Demo(workdir, console)
    began = time.monotonic()
    console.line("istio-cni demo: the chart, the agent and three pods on a simulated node")
    console.line(f"(work dir and logs: {workdir})")
    failed, step = "", 0
    try:
        with interrupts_raise():
            for step, (title, action) in enumerate(STEPS, start=1):
                console.line(f"\n[{step}/{len(STEPS)}] {title}")
                action(demo)
    except Interrupted as e:
        failed = f"interrupted by {e} during step {step} ({_title(step)})"
    except Exception as e:
        failed = f"step {step} ({_title(step)}): {e}"
    return finish(demo, failed=failed, began=began)


def _title(step: int) -> str:
    return STEPS[step - 1][0] if step else "start"


def finish(demo: Demo, *, failed: str, began: float) -> int:
    """Clean up, check nothing is left, and report; the exit code."""
    console = demo.console
    console.line(f"\n[cleanup] {'after the failure' if failed else 'everything the demo made'}")
    errors = demo.cleanup()
    errors += [f"left behind: {what}" for what in leftovers(demo)]
    if failed or errors:
        console.line(f"\nFAILED: {failed or 'cleanup'}")
        for error in errors:
            console.line(f"  cleanup: {error}")
        console.line("logs:")
        for log in sorted(demo.workdir.rglob("*.log")):
            console.line(f"  {log}")
        console.close()
        _remove_all_but_logs(demo.workdir)
        return 130 if failed.startswith("interrupted") else 1
    console.say("stopped etcd, kube-apiserver and kube-controller-manager; deleted network "
                f"namespaces {', '.join(demo.made_netns)}; removed {demo.workdir}")
    console.line(f"\ndone in {time.monotonic() - began:.0f} s; nothing left behind.")
    console.close()
    shutil.rmtree(demo.workdir, ignore_errors=True)
    return 0


def leftovers(demo: Demo) -> list[str]:
    """What the demo made that is still there: network namespaces, processes."""
    found = [f"network namespace {name}" for name in demo.made_netns if netns.exists(name)]
    marker = str(demo.workdir).encode()
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if marker in cmdline.read_bytes():  # every process started here names the work dir
                found.append(f"process {cmdline.parent.name}")
        except OSError:
            continue  # it ended meanwhile
    return found


def _remove_all_but_logs(workdir: Path) -> None:
    """After a failure only the logs stay, for reading; keys, tokens and data go."""
    for path in sorted(workdir.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if path.is_symlink() or (path.is_file() and path.suffix != ".log"):
            path.unlink(missing_ok=True)
        elif path.is_dir() and not any(path.iterdir()):
            path.rmdir()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ci.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.parse_args(argv)
    return run(sys.stdout)


if __name__ == "__main__":
    sys.exit(main())
