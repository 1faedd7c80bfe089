"""The pod UID in /proc/<pid>/cgroup, for the layouts kubelet and the runtimes make (cgroupfs and
systemd drivers, containerd and CRI-O and Docker, seen from inside a cgroup namespace or not)."""

from __future__ import annotations

import pytest

from agent.podnetns.cgroup import pod_uid_of_cgroups, pod_uid_of_path

UID = "2c48913c-b29f-11e7-9350-020968147796"
CID = "9bca8d63d5fa610783847915bcff0ecac1273e5b4bed3f6fa1b07350e0135961"


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        (f"/kubepods/besteffort/pod{UID}/{CID}", (UID, CID)),
        (f"/kubepods/pod{UID}/{CID}", (UID, CID)),
        (
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
            f"{UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope",
            (UID, CID),
        ),
        (
            f"/kubepods-besteffort-pod{UID.replace('-', '_')}.slice:cri-containerd:{CID}",
            (UID, CID),
        ),
        (f"/docker/{CID}/kubepods/besteffort/pod{UID}/{CID}", (UID, CID)),
        (f"/../../pod{UID}/{CID}", (UID, CID)),  # seen from inside a cgroup namespace
        (f"/kubepods/pod{UID.upper()}/{CID}", (UID, CID)),
        (f"/kubepods/pod{UID.replace('-', '')}/{CID}", (UID, CID)),
        ("/", None),
        ("/user.slice", None),
        (f"/k8s.io/{CID}", None),  # the runtime's own layout: no pod named
        (f"/../crio-{CID}.scope", None),
        (f"/kubepods/pod{UID[:-1]}/{CID}", None),  # 11 digits in the last group
        (f"/kubepods/xpod{UID}/{CID}", None),  # "pod" must follow punctuation
    ],
    ids=[
        "cgroupfs-qos",
        "cgroupfs",
        "systemd",
        "systemd-cri-containerd-colons",
        "docker-in-docker",
        "cgroup-namespace",
        "upper-case",
        "no-dashes",
        "root",
        "user-slice",
        "runtime-namespace-layout",
        "crio-without-pod",
        "short-uid",
        "not-a-pod-element",
    ],
)
def test_pod_uid_of_path(path: str, expected: tuple[str, str] | None) -> None:
    assert pod_uid_of_path(path) == expected


def test_every_line_must_name_the_same_pod() -> None:
    one = f"/kubepods/pod{UID}/{CID}"
    other_uid = "11111111-2222-3333-4444-555555555555"
    assert pod_uid_of_cgroups(f"12:pids:{one}\n11:memory:{one}\n0::/\n") == UID
    assert pod_uid_of_cgroups(f"12:pids:{one}\n11:memory:/kubepods/pod{other_uid}/{CID}") is None
    assert pod_uid_of_cgroups(f"12:pids:{one}\n11:memory:/kubepods/pod{UID}/abc") is None
    assert pod_uid_of_cgroups("0::/\n") is None
    assert pod_uid_of_cgroups("") is None


def test_a_malformed_file_names_no_pod() -> None:
    assert pod_uid_of_cgroups(f"garbage\n12:pids:/kubepods/pod{UID}/{CID}") is None
