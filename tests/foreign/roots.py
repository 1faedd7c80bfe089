"""Run the built plugin inside another userland's root file system, as a node would run it.

Each run is one process tree in its own private mount namespace (`unshare --mount`): a tmpfs
scratch mount, the root on top of it (an overlay over a cached root such as Debian 11, so the
cache is never written, or an empty directory), the plugin copied in, optionally the agent's run
dir bind-mounted at /run/istio-cni, then `chroot` and exec of the plugin with only the given
environment. Every mount dies with the namespace when the plugin exits, whatever happens.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
RUN_DIR_IN_ROOT = "/run/istio-cni"

# Runs on the host side inside the new mount namespace; the last exec enters the root.
ENTER = r"""
set -eu
scratch=$1 base=$2 plugin=$3 dest=$4 run=$5 chroot=$6
shift 6
mount -t tmpfs -o mode=0755 istio-cni-test "$scratch"
mkdir "$scratch/root"
if [ -n "$base" ]; then
  mkdir "$scratch/upper" "$scratch/work"
  mount -t overlay istio-cni-test \
    -o "lowerdir=$base,upperdir=$scratch/upper,workdir=$scratch/work" "$scratch/root"
fi
root=$scratch/root
mkdir -p "$root$(dirname "$dest")"
cp "$plugin" "$root$dest"
if [ -n "$run" ]; then
  mkdir -p "$root/run/istio-cni"
  mount --bind "$run" "$root/run/istio-cni"
fi
[ -n "${LIST_ROOT:-}" ] && { cd "$root" && find . -mindepth 1 | sort >&2; }
exec env -i "$@" "$chroot" "$root" "$dest"
"""


@dataclass(frozen=True)
class Run:
    code: int
    stdout: str
    stderr: str

    @property
    def out(self) -> Any:
        return json.loads(self.stdout) if self.stdout.strip() else None


@dataclass
class ForeignRoot:
    """A root to run the plugin in: `base` None is an empty root holding only the plugin."""

    name: str
    base: Path | None
    plugin: Path
    scratch: Path

    @property
    def plugin_path(self) -> str:
        return "/istio-cni" if self.base is None else "/opt/cni/bin/istio-cni"

    def run(
        self,
        env: dict[str, str],
        stdin: str | dict[str, Any] = "",
        run_dir: Path | None = None,
        list_root: bool = False,
    ) -> Run:
        data = stdin if isinstance(stdin, str) else json.dumps(stdin)
        unshare, chroot = shutil.which("unshare"), shutil.which("chroot")
        assert unshare and chroot, "unshare and chroot (util-linux, coreutils) are needed"
        argv = [
            unshare,
            "--mount",
            "--propagation",
            "private",
            "--",
            "/bin/sh",
            "-c",
            ENTER,
            "enter",
            str(self.scratch),
            str(self.base or ""),
            str(self.plugin),
            self.plugin_path,
            str(run_dir or ""),
            chroot,
            *(f"{k}={v}" for k, v in env.items()),
        ]
        host_env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
        if list_root:
            host_env["LIST_ROOT"] = "1"
        done = subprocess.run(
            argv, input=data, capture_output=True, text=True, env=host_env, timeout=60, check=False
        )
        return Run(done.returncode, done.stdout, done.stderr)


def setup_roots() -> dict[str, Path]:
    """The cached foreign roots, made by ci/setup-foreign-roots (which fails loudly if it can't)."""
    done = subprocess.run(
        [str(REPO / "ci" / "setup-foreign-roots")],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert done.returncode == 0, f"ci/setup-foreign-roots failed:\n{done.stderr[-3000:]}"
    roots = {}
    for line in done.stdout.splitlines():
        name, path = line.split(" ", 1)
        roots[name] = Path(path)
    return roots
