"""A throwaway containerd (Debian's, with runc) for the image tests: its own root, state, socket
and opt dir under a temporary directory, no CRI plugin, and everything it made (shims, containers,
mounts, the directory) removed by stop(), also after a failure.

Also runnable to check an archive by hand:
    .venv/bin/python -m tests.image.containerd ARCHIVE REF [--read-only] [-- ARGS...]
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

from testbed.wait import WaitTimeout, wait_for

NAMESPACE = "k8s.io"  # the namespace kubelet's images live in, as on the real node

CONFIG = """version = 2
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "{sock}"
[plugins."io.containerd.internal.v1.opt"]
  path = "{opt}"
"""


# The capabilities containerd gives a container by default (oci.defaultUnixCaps).
DEFAULT_CAPS = (
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW",
    "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
)  # fmt: skip


class ContainerdError(RuntimeError):
    pass


class Containerd:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.sock = workdir / "containerd.sock"
        self.log_path = workdir / "containerd.log"
        self._proc: subprocess.Popen[bytes] | None = None

    # --- life cycle
    def start(self, timeout: float = 30) -> None:
        for tool in ("containerd", "ctr", "runc", "containerd-shim-runc-v2"):
            if not shutil.which(tool):
                raise ContainerdError(f"no {tool} on PATH: run ci/setup-apt")
        cfg = self.workdir / "config.toml"
        cfg.write_text(
            CONFIG.format(
                root=self.workdir / "root",
                state=self.workdir / "state",
                sock=self.sock,
                opt=self.workdir / "opt",
            )
        )
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                ["containerd", "--config", str(cfg)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            wait_for(self._answers, "containerd to answer", timeout, interval=0.2)
        except WaitTimeout as e:
            raise ContainerdError(f"containerd not ready within {timeout}s:\n{self.tail()}") from e

    def _answers(self) -> bool:
        """`ctr version` succeeds on the socket; raises when containerd has exited."""
        assert self._proc is not None
        if self._proc.poll() is not None:
            raise ContainerdError(f"containerd exited at start:\n{self.tail()}")
        return self.sock.exists() and self.ctr("version", check=False).returncode == 0

    def stop(self) -> None:
        """Stops every task and shim of this instance, then containerd; unmounts and deletes."""
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(Exception):
                for cid in self.ctr("containers", "list", "-q", check=False).stdout.split():
                    self.ctr("tasks", "kill", "-s", "SIGKILL", cid, check=False)
                    with contextlib.suppress(WaitTimeout):  # delete -f below stops it anyway
                        wait_for(functools.partial(self._task_ended, cid), f"task {cid} to end", 2)
                    self.ctr("tasks", "delete", "-f", cid, check=False)
                    self.ctr("containers", "delete", cid, check=False)
        for pid in self._shim_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.terminate()
                try:
                    self._proc.wait(10)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait()
            self._proc = None
        for mnt in reversed(self._mounts()):
            subprocess.run(["umount", "-l", mnt], check=False, capture_output=True)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def _shim_pids(self) -> list[int]:
        """The shims started for this instance: their command line names our socket."""
        pids = []
        needle = str(self.sock).encode()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if b"containerd-shim" in cmdline and needle in cmdline:
                pids.append(int(entry.name))
        return pids

    def _mounts(self) -> list[str]:
        prefix = str(self.workdir) + "/"
        with open("/proc/self/mountinfo") as f:
            points = [line.split()[4] for line in f]
        return [p for p in points if p.startswith(prefix)]

    def _task_ended(self, cid: str) -> bool:
        tasks = self.ctr("tasks", "ls", check=False).stdout
        return not any(
            line.split()[:1] == [cid] and "RUNNING" in line for line in tasks.splitlines()
        )

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError as e:
            return f"(no containerd log: {e})"

    # --- ctr
    def ctr(
        self, *args: str, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        argv = ["ctr", "--address", str(self.sock), "-n", NAMESPACE, *args]
        r = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,  # `ctr run` forwards stdin: the container sees EOF
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
            check=False,
        )
        if check and r.returncode != 0:
            raise ContainerdError(
                f"{' '.join(argv)} exited {r.returncode}:\n{r.stdout}{r.stderr}"
                f"\n--- containerd log:\n{self.tail()}"
            )
        return r

    def import_archive(self, archive: Path) -> list[str]:
        """Imports a docker-archive; returns the refs containerd now has."""
        self.ctr("images", "import", str(archive), timeout=300)
        return self.ctr("images", "list", "-q").stdout.split()

    def run(
        self,
        ref: str,
        args: Sequence[str] = (),
        *,
        read_only: bool = False,
        cap_drop_all: bool = False,
        cap_add: Sequence[str] = (),
        tmpfs: Sequence[str] = (),
        env: Sequence[str] = (),
        binds: Sequence[tuple[str, str]] = (),
        no_stdin: bool = False,
        timeout: float = 120,
    ) -> subprocess.CompletedProcess[str]:
        """ctr run --rm with runc: the container's exit status, stdout and stderr.

        ctr keeps the container's stdin open whatever its own is: with no_stdin the process
        gets none (EOF), and its stdout and stderr come back together as stdout."""
        opts = ["--rm", "--runtime", "io.containerd.runc.v2"]
        log = self.workdir / f"run-{uuid.uuid4().hex[:10]}.log"
        if no_stdin:
            opts += ["--log-uri", f"file://{log}"]
        if read_only:
            opts.append("--read-only")
        if cap_drop_all:  # ctr knows no "ALL", and drops after it adds
            opts += [x for c in DEFAULT_CAPS if c not in cap_add for x in ("--cap-drop", c)]
        for cap in cap_add:
            opts += ["--cap-add", cap]
        for path in tmpfs:
            opts += ["--mount", f"type=tmpfs,src=tmpfs,dst={path},options=nosuid:nodev:size=16m"]
        for e in env:
            opts += ["--env", e]
        for src, dst in binds:
            opts += ["--mount", f"type=bind,src={src},dst={dst},options=rbind:ro"]
        cid = f"image-test-{uuid.uuid4().hex[:10]}"
        r = self.ctr("run", *opts, ref, cid, *args, check=False, timeout=timeout)
        if no_stdin:
            out = log.read_text(errors="replace") if log.exists() else ""
            r = subprocess.CompletedProcess(r.args, r.returncode, out + r.stdout, r.stderr)
        return r


@contextlib.contextmanager
def throwaway_containerd(parent: Path | None = None) -> Iterator[Containerd]:
    workdir = Path(tempfile.mkdtemp(prefix="image-containerd.", dir=parent))
    c = Containerd(workdir)
    try:
        c.start()
        yield c
    finally:
        c.stop()


def _main(argv: list[str]) -> int:
    cut = argv.index("--") if "--" in argv else len(argv)
    args, cmd = argv[:cut], argv[cut + 1 :]
    read_only = "--read-only" in args
    args = [a for a in args if a != "--read-only"]
    if len(args) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    archive, ref = Path(args[0]), args[1]
    with throwaway_containerd() as c:
        print("imported:", " ".join(c.import_archive(archive)))
        r = c.run(ref, cmd, read_only=read_only)
        print(f"exit {r.returncode}\n--- stdout\n{r.stdout}--- stderr\n{r.stderr}", end="")
        return r.returncode


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
