"""Test-only: SIGKILL an installer process right before its Nth file operation on the node.

The product carries no hook. In the process about to be killed, `arm(n)` replaces the `os` and
`shutil` names of the installer's file modules (agent.install.atomic and agent.install.binaries:
every write, chmod, fsync, rename, unlink, copy and tree removal on the node goes through them)
with stand-ins that count each such call and die, as an OOM kill would, right before the Nth.
So the kill tests reach every window between two file operations instead of hitting them by
luck; a process that performs fewer than N operations finishes normally, which is how a test
knows it has visited every point.

    python -m tests.install.kill_hook N install|uninstall --config FILE
runs the agent's command line with the hook armed (a real `istio-cni-agent` process).
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import types
from collections.abc import Callable
from typing import Any

COUNTED = {
    "agent.install.atomic": {
        os: ("open", "write", "fchmod", "fsync", "replace", "rename", "unlink"),
        shutil: ("rmtree",),
    },
    "agent.install.binaries": {os: ("rename", "unlink"), shutil: ("copy2", "copytree", "rmtree")},
}
"""Per module, the calls counted: each step that changes a file on the node (a temp created,
written, chmodded, fsynced, renamed; a file unlinked; a copy; a tree removed), and the fsync that
makes a rename durable. Reads (os.open without O_CREAT) are not steps."""


class _Counting:
    """Stands in for a module: the counted calls go through `before`, the rest pass through."""

    def __init__(
        self, module: types.ModuleType, names: tuple[str, ...], before: Callable[[str, Any], None]
    ) -> None:
        self._module = module
        self._counted = set(names)
        self._before = before

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._module, name)
        if name not in self._counted:
            return value
        label = f"{self._module.__name__}.{name}"

        def counted(*args: Any, **kwargs: Any) -> Any:
            creates = name != "open" or (len(args) > 1 and args[1] & os.O_CREAT)
            if creates:
                self._before(label, args[0] if args else "")
            return value(*args, **kwargs)

        return counted


def arm(n: int) -> None:
    """From now on, die right before the Nth counted file operation of the installer."""
    from agent.install import atomic, binaries

    count = 0

    def before(what: str, target: Any) -> None:
        nonlocal count
        count += 1
        if count == n:
            # One line for the test's failure message, then die as an OOM kill would.
            sys.stderr.write(f"kill hook {n}: SIGKILL before {what} {target}\n")
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    for module in (atomic, binaries):
        for real, names in COUNTED[module.__name__].items():
            if getattr(module, real.__name__, None) is real:
                setattr(module, real.__name__, _Counting(real, names, before))


def main(argv: list[str]) -> int:
    arm(int(argv[0]))
    from agent import cli

    return cli.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
