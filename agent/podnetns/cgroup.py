"""The pod UID in a process's cgroup paths (`/proc/<pid>/cgroup`), as kubelet names pod cgroups.

kubelet puts every container of a pod under a cgroup named for the pod's UID, whatever the driver:
    /kubepods/besteffort/pod2c48913c-b29f-11e7-9350-020968147796/<container id>
    /kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod2c48913c_b29f_11e7_9350_020968147796.slice/cri-containerd-<id>.scope
    /../../pod2c48913c-b29f-11e7-9350-020968147796/<container id>     (seen from a cgroup namespace)
The pattern is the one Istio's node agent uses (cni/pkg/nodeagent podcgroupns.go): "pod" and a
UID of 32 hex digits in 8-4-4-4-12 groups (any punctuation between them, given back in the API's
spelling), then the container id as the last element. A container cannot rename its own cgroup;
every line of the file must agree on one pod, or the process names none.
"""

from __future__ import annotations

import re

_PUNCT = r"""[!-/:-@\[-`{-~]"""
_WORD = r"""[^!-/:-@\[-`{-~]"""
_HEX = "[0-9A-Fa-f]"
_UID = f"{_PUNCT}?".join(f"{_HEX}{{{n}}}" for n in (8, 4, 4, 4, 12))
_POD_PATH = re.compile(
    f"{_PUNCT}pod(?P<uid>{_UID}){_PUNCT}(?:{_WORD}+{_PUNCT})*(?P<container>{_WORD}+)$"
)
_CANONICAL = re.compile(_PUNCT)


def pod_uid_of_path(path: str) -> tuple[str, str] | None:
    """(pod UID in Kubernetes' form, container id) named by one cgroup path, or None."""
    path = path.removesuffix(".scope")
    match = _POD_PATH.search(path)
    if match is None:
        return None
    digits = _CANONICAL.sub("", match["uid"]).lower()
    uid = "-".join((digits[:8], digits[8:12], digits[12:16], digits[16:20], digits[20:]))
    return uid, match["container"]


def pod_uid_of_cgroups(text: str) -> str | None:
    """The pod UID named by a `/proc/<pid>/cgroup` file ("id:controllers:path" lines); None when
    no line names a pod, or when lines name different pods or containers (not to be trusted)."""
    found: tuple[str, str] | None = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            return None
        named = pod_uid_of_path(parts[2])
        if named is None:
            continue
        if found is not None and named != found:
            return None
        found = named
    return found[0] if found is not None else None
