"""`istio-cni`: the CNI plugin the container runtime executes for every pod sandbox."""

from __future__ import annotations

import io
import os
import sys

from plugin.commands import Plugin
from plugin.skel import dispatch


def main() -> int:
    # A runtime that closed stdin still gets a CNI error object, not a traceback.
    stdin = sys.stdin.buffer if sys.stdin is not None else io.BytesIO()
    return dispatch(
        Plugin(stderr=sys.stderr).commands(),
        environ=os.environ,
        stdin=stdin,
        stdout=sys.stdout,
        stderr=sys.stderr,
    )


if __name__ == "__main__":
    sys.exit(main())
