"""CNI error codes and the one exception every plugin step raises to fail a command.

The codes are the CNI specification's well-known ones; the dispatcher prints a CniError as the
spec's error object `{cniVersion, code, msg, details}` on stdout and exits 1.
"""

from __future__ import annotations

INCOMPATIBLE_VERSION = 1
UNSUPPORTED_FIELD = 2
UNKNOWN_CONTAINER = 3
INVALID_ENV = 4
IO_FAILURE = 5
DECODING_FAILURE = 6
INVALID_CONFIG = 7
TRY_AGAIN_LATER = 11
NOT_AVAILABLE = 50
"""STATUS (1.1): the plugin cannot service ADD requests."""
INTERNAL = 999


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
