"""CNI spec versions this plugin speaks, and conversion of results between them.

Results come in two shapes: 0.3.0/0.3.1/0.4.0 (each `ips[]` entry carries `"version": "4"|"6"`)
and 1.0.0/1.1.0 (no `version`; 1.1.0 only adds optional fields: interface `mtu`, `socketPath`,
`pciID`, route `mtu`, `advmss`, `priority`, `table`, `scope`). A chained plugin returns its
`prevResult` in the config's `cniVersion`, so a result is converted to that version's shape.
Everything else in the result passes through unchanged.
"""

from __future__ import annotations

from plugin.errors import INCOMPATIBLE_VERSION, INVALID_CONFIG, CniError

TYPE_CHECKING = False  # not typing's: importing typing costs ~10 ms of start-up
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

SUPPORTED = ("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")
LATEST = SUPPORTED[-1]
CHECK_SINCE = "0.4.0"
GC_STATUS_SINCE = "1.1.0"

_NEW_INTERFACE_KEYS = ("mtu", "socketPath", "pciID")
_NEW_ROUTE_KEYS = ("mtu", "advmss", "priority", "table", "scope")


def key(version: str) -> tuple[int, int, int]:
    """Sortable form of a supported version string."""
    major, minor, patch = version.split(".")
    return int(major), int(minor), int(patch)


def at_least(version: str, minimum: str) -> bool:
    return key(version) >= key(minimum)


def version_info(requested: object) -> dict[str, Any]:
    """The VERSION reply: echo the caller's version when we speak it, else our latest."""
    version = requested if requested in SUPPORTED else LATEST
    return {"cniVersion": version, "supportedVersions": list(SUPPORTED)}


def convert_result(result: Mapping[str, Any], to_version: str) -> dict[str, Any]:
    """`result` in the shape of `to_version`, with its other fields untouched.

    A result without its own cniVersion is taken to be in the config's version (as the runtime
    should have converted it already). Raises CniError naming the field that cannot be read.
    """
    out = {k: v for k, v in result.items() if k.lower() != "cniversion"}
    own = next((v for k, v in result.items() if k.lower() == "cniversion"), None)
    if own not in (None, "") and own not in SUPPORTED:
        raise CniError(
            INCOMPATIBLE_VERSION,
            f"prevResult cniVersion {own!r} is not supported",
            f"supported versions: {', '.join(SUPPORTED)}",
        )
    legacy = key(to_version) < (1, 0, 0)
    if "ips" in out:
        out["ips"] = [_convert_ip(ip, n, legacy) for n, ip in enumerate(_list(out, "ips"))]
    if "interfaces" in out:
        out["interfaces"] = [
            _strip(i, f"prevResult.interfaces[{n}]", _NEW_INTERFACE_KEYS, legacy)
            for n, i in enumerate(_list(out, "interfaces"))
        ]
    if "routes" in out:
        out["routes"] = [
            _strip(r, f"prevResult.routes[{n}]", _NEW_ROUTE_KEYS, legacy)
            for n, r in enumerate(_list(out, "routes"))
        ]
    if "dns" in out and not isinstance(out["dns"], dict):
        raise CniError(INVALID_CONFIG, "prevResult.dns must be an object")
    return {"cniVersion": to_version, **out}


def _list(result: Mapping[str, Any], field: str) -> list[Any]:
    value = result[field]
    if value is None:
        return []
    if not isinstance(value, list):
        raise CniError(INVALID_CONFIG, f"prevResult.{field} must be a list")
    return value


def _strip(item: object, where: str, new_keys: tuple[str, ...], legacy: bool) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise CniError(INVALID_CONFIG, f"{where} must be an object")
    return {k: v for k, v in item.items() if k not in new_keys} if legacy else dict(item)


def _convert_ip(ip: object, n: int, legacy: bool) -> dict[str, Any]:
    where = f"prevResult.ips[{n}]"
    if not isinstance(ip, dict):
        raise CniError(INVALID_CONFIG, f"{where} must be an object")
    address = ip.get("address")
    if not isinstance(address, str):
        raise CniError(INVALID_CONFIG, f"{where}.address must be a string (CIDR)")
    out = {k: v for k, v in ip.items() if k != "version"}
    if legacy:
        out = {"version": _ip_version(address, where), **out}
    return out


def _ip_version(address: str, where: str) -> str:
    import ipaddress  # only 0.x results need it: keep it off the common start-up path

    try:
        return str(ipaddress.ip_interface(address).version)
    except ValueError as e:
        raise CniError(INVALID_CONFIG, f"{where}.address {address!r} is not an IP/prefix") from e
