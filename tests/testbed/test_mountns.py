"""A node's made mount-point dirs are removed at its clean-up, except one another live mount
namespace still mounts on (another bed's node, side by side): removing it would detach that
mount there, and with it that node's CNI bin dir."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from testbed import mountns


def test_a_dir_mounted_on_elsewhere_is_left_with_the_dirs_above_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    used, free = tmp_path / "opt" / "cni" / "bin", tmp_path / "etc" / "cni"
    used.mkdir(parents=True)
    free.mkdir(parents=True)
    made = [str(tmp_path / "opt"), str(tmp_path / "opt" / "cni"), str(used)]
    made += [str(tmp_path / "etc"), str(free)]
    monkeypatch.setattr(mountns, "mounted_in_other_namespaces", lambda paths: {str(used)})
    mountns.remove_made_dirs(made)
    assert used.is_dir() and not (tmp_path / "etc").exists()


@pytest.mark.netns
def test_a_bind_mount_in_another_namespace_is_found(tmp_path: Path) -> None:
    source, target = tmp_path / "source", tmp_path / "target"
    source.mkdir()
    target.mkdir()
    holder = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c",
         f"mount --bind {source} {target} && echo up && exec sleep 30"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "up"
        deadline = time.monotonic() + 5
        while str(target) not in mountns.mounted_in_other_namespaces([str(tmp_path)]):
            assert time.monotonic() < deadline, "the other namespace's bind mount not found"
            time.sleep(0.05)
        mountns.remove_made_dirs([str(target)])
        assert target.is_dir()  # left: the other namespace's mount stays
    finally:
        holder.kill()
        holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()
    assert str(target) not in mountns.mounted_in_other_namespaces([str(tmp_path)])
    mountns.remove_made_dirs([str(target)])
    assert not target.exists()
