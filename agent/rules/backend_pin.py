"""The node's `auto` rule backend, decided once per boot and kept across agent restarts.

Istio's ambient agent decides the iptables variant of each family once, at start, in the node's
namespace, and uses it for the node's rules and every pod's. Deciding again at every start lets the
choice flip on a node whose tables changed meanwhile (Istio's own look creates an empty legacy
table, so its second start on a node picks legacy where the first picked nft, and pods enrolled
before get a second set of rules). Here the first decision of a boot is written to the agent's run
dir on the node, keyed by the kernel's boot id, and read back by every later start of the same
boot while the setting is still `auto`; a new boot decides again. A setting other than `auto`
removes the record, so returning to `auto` decides afresh.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from collections.abc import Callable

from agent.errors import RedirectError
from agent.rules import backends
from agent.rules.backends import FamilyChoice

log = logging.getLogger(__name__)

STATE_FILE = "rule-backend.json"
"""In the agent's run dir (cniAgentRunDir): {"bootId", "ipv4", "ipv6"}."""
BOOT_ID = "/proc/sys/kernel/random/boot_id"


def host_choice() -> FamilyChoice:
    """What `auto` decides in the node's namespace now (the agent runs on the host network)."""
    return backends.detect(backends.HOST_NETNS)


def node_backend(
    configured: str,
    run_dir: str,
    *,
    boot_id_file: str = BOOT_ID,
    decide: Callable[[], FamilyChoice] = host_choice,
) -> str:
    """The backend setting for the node's decisions: `configured` unless it is `auto`, else the
    choice pinned for this boot (a FamilyChoice label, which agent.rules.backends takes)."""
    path = os.path.join(run_dir, STATE_FILE)
    if configured != "auto":
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return configured
    boot = _boot_id(boot_id_file)
    pinned = _read(path, boot)
    if pinned is not None:
        log.info(
            "rule backend as decided earlier in this boot",
            extra={"fields": {"backend": pinned.label, "file": path}},
        )
        return pinned.label
    try:
        choice = decide()
    except RedirectError as e:
        log.warning("could not decide the rule backend", extra={"fields": {"error": str(e)}})
        return configured  # each namespace's `auto` decides, and says why it cannot
    try:
        _write(path, {"bootId": boot, "ipv4": choice.ipv4, "ipv6": choice.ipv6})
    except OSError as e:
        log.warning(
            "could not record the rule backend for this boot; a restart decides again",
            extra={"fields": {"file": path, "error": e.strerror}},
        )
    log.info("rule backend decided for this boot", extra={"fields": {"backend": choice.label}})
    return choice.label


def _boot_id(path: str) -> str:
    try:
        with open(path, encoding="ascii") as f:
            return f.read().strip()
    except (OSError, UnicodeDecodeError):
        return ""  # no boot id: never matches a record, so every start decides


def _read(path: str, boot: str) -> FamilyChoice | None:
    """The recorded choice if made in boot `boot` (None: none, another boot, unreadable)."""
    if not boot:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("bootId") != boot:
        return None
    label = f"ipv4={record.get('ipv4')},ipv6={record.get('ipv6')}"
    return FamilyChoice.parse(label)


def _write(path: str, record: dict[str, str]) -> None:
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{STATE_FILE}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(record, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
