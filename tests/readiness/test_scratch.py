"""rules: the real rule backends program and find a sidecar pod's rules in the agent's scratch
network namespace, which only a descriptor holds and stop() frees; a backend that cannot work
fails the check naming itself."""

from __future__ import annotations

import os
import subprocess

import pytest

from agent.readiness.scratch import RulesCheck, ScratchNetns
from agent.rules.sidecar.redirector import RulesRedirector

pytestmark = pytest.mark.netns


def rules_check(backend: str) -> RulesCheck:
    return RulesCheck(RulesRedirector(exclude_namespaces=(), backend=backend), backend=backend)


@pytest.mark.parametrize("backend", ["auto", "iptables-nft", "iptables-legacy", "nftables"])
def test_each_backend_passes_in_the_scratch_namespace(backend: str) -> None:
    check = rules_check(backend)
    check.start()
    try:
        assert check() is None
        assert check() is None  # again: the rules replace our rules
        listing = subprocess.run(
            ["nsenter", f"--net={check.scratch.path}", "--", "nft", "list", "ruleset"]
            if backend == "nftables"
            else ["nsenter", f"--net={check.scratch.path}", "--", _save(backend), "-t", "nat"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert "ISTIO_OUTPUT" in listing or "istio" in listing.lower(), listing
    finally:
        check.stop()


def _save(backend: str) -> str:
    return "iptables-legacy-save" if backend == "iptables-legacy" else "iptables-nft-save"


def test_the_namespace_is_held_by_a_descriptor_only_and_freed_on_stop() -> None:
    own = os.stat("/proc/self/ns/net")
    scratch = ScratchNetns()
    scratch.open()
    path = scratch.path
    try:
        st = os.stat(path)
        assert (st.st_dev, st.st_ino) != (own.st_dev, own.st_ino)  # a namespace of its own
        assert os.stat("/proc/self/ns/net").st_ino == own.st_ino  # no thread of ours moved
    finally:
        scratch.close()
    assert not os.path.exists(path)
    with pytest.raises(OSError, match="not open"):
        _ = scratch.path
    scratch.close()  # idempotent


def test_a_backend_that_cannot_work_fails_naming_it() -> None:
    check = rules_check("ebpf")
    check.start()
    try:
        reason = check()
    finally:
        check.stop()
    assert reason is not None
    assert reason.startswith("rules backend ebpf fails in a scratch network namespace")
    assert "unknown rule backend 'ebpf'" in reason
