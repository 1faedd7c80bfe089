"""The live demonstration behind `ci/demo`, on a real node: a control plane and kube-scheduler,
kubelet and containerd in a network namespace of their own, the chart installed with the agent
image built here, two pods started by kubelet through the runtime's CNI chain, the rules the agent
programmed in the sidecar pod and its redirected connections, then `helm uninstall`.

Everything runs on this machine, on loopback and in network namespaces made here; nothing is
left behind, also on failure, Ctrl-C or SIGTERM. Run from the repository root as root:
`python -m ci.demo` (ci/demo first installs or reuses the prerequisites and builds the images,
then runs this with the project's virtualenv). Exit code 0 when every step passed, 1 naming the
step that failed, 130 when interrupted.
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
from testbed import netns

STEPS: list[tuple[str, Callable[[Demo], None]]] = [
    ("Start a control plane and a node run by kubelet and containerd", Demo.start_node),
    ("helm install the chart", Demo.helm_install),
    ("Show the node's CNI config", Demo.show_conflist),
    ("Create a sidecar pod and a plain pod", Demo.start_pods),
    ("Show the rules in the pods' network namespaces", Demo.show_rules),
    ("Connections from and to the pods", Demo.show_traffic),
    ("The agent's log", Demo.show_agent_log),
    ("helm uninstall", Demo.uninstall),
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
    console.line("istio-cni demo: the chart, its agent and two pods on a real node")
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
    console.say(
        "stopped kubelet, containerd and every container, kube-scheduler, "
        "kube-controller-manager, kube-apiserver and etcd; unmounted and deleted the "
        f"node's network namespace {', '.join(made_netns(demo))} and {demo.workdir}"
    )
    console.line(f"\ndone in {time.monotonic() - began:.0f} s; nothing left behind.")
    console.close()
    shutil.rmtree(demo.workdir, ignore_errors=True)
    return 0


def made_netns(demo: Demo) -> list[str]:
    return [demo.cluster.network.netns_name] if demo.cluster is not None else []


def leftovers(demo: Demo) -> list[str]:
    """What the demo made that is still there: network namespaces, mounts, processes."""
    found = [f"network namespace {name}" for name in made_netns(demo) if netns.exists(name)]
    with open("/proc/self/mountinfo") as mounts:
        found += [
            f"mount {line.split()[4]}" for line in mounts if str(demo.workdir) in line.split()[4]
        ]
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
    parser = argparse.ArgumentParser(
        prog="python -m ci.demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.parse_args(argv)
    return run(sys.stdout)


if __name__ == "__main__":
    sys.exit(main())
