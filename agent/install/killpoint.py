"""Test hook: die by SIGKILL right before the Nth file operation on the node's CNI dirs.

The kill tests (tests/install/test_kill_anywhere.py, bench/kill_anywhere.py) use it to stop
`install` and `uninstall` exactly before each step that changes a file (create, write, chmod,
fsync, rename, unlink, copy, remove a tree), so the rare windows are hit every time instead of by
luck. Set ISTIO_CNI_KILL_BEFORE_FILE_OP=N in the environment of an agent process (read once at
import), or call `arm(N)` in a forked child. A process that performs fewer than N operations
finishes normally, which is how a test knows it has visited every point.

Cost when unarmed (production): every call site does `killpoint.before(...)`, a call of a
function that returns at once; it sits beside a syscall that costs thousands of times more.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable

ENV = "ISTIO_CNI_KILL_BEFORE_FILE_OP"


def _unarmed(what: str, path: str) -> None:
    """The production hook: nothing."""


def _armed(n: int) -> Callable[[str, str], None]:
    count = 0

    def hook(what: str, path: str) -> None:
        nonlocal count
        count += 1
        if count == n:
            # One line for the test's failure message, then die as an OOM kill would.
            sys.stderr.write(f"killpoint {n}: SIGKILL before {what} {path}\n")
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    return hook


before: Callable[[str, str], None] = _unarmed
"""Called right before each file operation: `before("rename", path)`."""


def arm(n: int | None) -> None:
    """Die before the Nth operation from now on (None: disarm)."""
    global before
    before = _unarmed if n is None else _armed(n)


def _from_env() -> None:
    raw = os.environ.get(ENV, "")
    if not raw:
        return
    try:
        n = int(raw)
    except ValueError:
        raise SystemExit(f"{ENV}={raw!r}: not an integer") from None
    arm(n)


_from_env()
