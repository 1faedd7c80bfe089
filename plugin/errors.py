"""The one exception every plugin step raises to fail a command.

Its code is one of the CNI specification's well-known ones (plugin.wire, which the agent's
replies use too); the dispatcher prints a CniError as the spec's error object `{cniVersion,
code, msg, details}` on stdout and exits 1.
"""

from __future__ import annotations


class CniError(Exception):
    """Fails the current command with a CNI error code, a short message and details."""

    def __init__(self, code: int, msg: str, details: str = "") -> None:
        super().__init__(msg)
        self.code = code
        self.msg = msg
        self.details = details

    def to_object(self, cni_version: str) -> dict[str, object]:
        return {
            "cniVersion": cni_version,
            "code": self.code,
            "msg": self.msg,
            "details": self.details,
        }
