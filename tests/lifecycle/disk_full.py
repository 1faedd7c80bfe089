"""Test-only: run the agent's command line with the node's disk full while a file exists.

    python -m tests.lifecycle.disk_full FLAG run --config FILE

Every write of the installer's file module (agent.install.atomic: each config and plugin write)
fails with ENOSPC while FLAG exists, as on a node whose disk is full; removing FLAG frees it.
The product carries no hook.
"""

from __future__ import annotations

import errno
import os
import sys
from typing import Any


class _DiskFull:
    """Stands in for `os` in agent.install.atomic: `write` fails while the flag exists."""

    def __init__(self, flag: str) -> None:
        self._flag = flag

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def write(self, fd: int, data: Any) -> int:
        if os.path.exists(self._flag):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return os.write(fd, data)


def main(argv: list[str]) -> int:
    from agent import cli
    from agent.install import atomic

    setattr(atomic, "os", _DiskFull(argv[0]))  # noqa: B010 (a module global, test-only)
    return cli.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
