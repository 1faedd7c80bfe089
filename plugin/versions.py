"""CNI spec versions this plugin speaks, and conversion of results between them.

Results come in three shapes: 0.1.0/0.2.0 (`ip4`, `ip6`: one address each, their routes),
0.3.0/0.3.1/0.4.0 (each `ips[]` entry carries `"version": "4"|"6"`) and 1.0.0/1.1.0 (no
`version`; 1.1.0 only adds optional fields: interface `mtu`, `socketPath`, `pciID`, route `mtu`,
`advmss`, `priority`, `table`, `scope`). A chained plugin returns its `prevResult` in the
config's `cniVersion`, so a result is converted to that version's shape. Everything else in the
result passes through unchanged.

A config without `cniVersion` (or with "") is version 0.1.0, as libcni's decoder and every
plugin built on its skeleton read it: libcni hands "" to every plugin of a list that has none.
"""

from __future__ import annotations

from plugin.errors import CniError
from plugin.wire import INCOMPATIBLE_VERSION, INVALID_CONFIG

TYPE_CHECKING = False  # not typing's: importing typing costs ~10 ms of start-up
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

SUPPORTED = ("0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")
UNVERSIONED = "0.1.0"
"""What an absent or empty cniVersion means (libcni's version.ConfigDecoder)."""
LIST_SINCE = "0.3.0"
"""Lists, chaining and `ips[]` results exist from this version on."""
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
    should have converted it already), unless its shape says otherwise. Raises CniError naming
    the field that cannot be read.
    """
    out = {k: v for k, v in result.items() if k.lower() != "cniversion"}
    own = next((v for k, v in result.items() if k.lower() == "cniversion"), None)
    if own not in (None, "") and own not in SUPPORTED:
        raise CniError(
            INCOMPATIBLE_VERSION,
            f"prevResult cniVersion {own!r} is not supported",
            f"supported versions: {', '.join(SUPPORTED)}",
        )
    from_legacy = _is_legacy_shape(out, own if own else to_version)
    if key(to_version) < key(LIST_SINCE):
        return {"cniVersion": to_version, **(out if from_legacy else _to_legacy(out))}
    if from_legacy:
        out = _from_legacy(out)
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


def _is_legacy_shape(result: Mapping[str, Any], version: str) -> bool:
    """A 0.1.0/0.2.0 result (ip4/ip6), by its version or, without one, by its fields."""
    if "ips" in result or "interfaces" in result:
        return False
    return key(version) < key(LIST_SINCE) or "ip4" in result or "ip6" in result


def _from_legacy(result: dict[str, Any]) -> dict[str, Any]:
    """ip4/ip6 as `ips[]` and their routes as `routes[]` (libcni's 0.2.0 -> 0.3.0 step)."""
    out = {k: v for k, v in result.items() if k not in ("ip4", "ip6")}
    ips: list[dict[str, Any]] = []
    routes: list[Any] = []
    for family in ("ip4", "ip6"):
        config = result.get(family)
        if config is None:
            continue
        if not isinstance(config, dict) or not isinstance(config.get("ip"), str):
            raise CniError(INVALID_CONFIG, f"prevResult.{family} must be an object with ip")
        ip = {"address": config["ip"]}
        if "gateway" in config:
            ip["gateway"] = config["gateway"]
        ips.append(ip)
        routes += _list(config, "routes") if "routes" in config else []
    out["ips"] = ips
    if routes:
        out["routes"] = routes
    return out


def _to_legacy(result: dict[str, Any]) -> dict[str, Any]:
    """The first address of each family as ip4/ip6 with its routes (libcni's 0.3.0 -> 0.2.0)."""
    out = {k: v for k, v in result.items() if k not in ("ips", "interfaces", "routes")}
    ips = _list(result, "ips") if "ips" in result else []
    routes = _list(result, "routes") if "routes" in result else []
    for n, ip in enumerate(ips):
        where = f"prevResult.ips[{n}]"
        if not isinstance(ip, dict) or not isinstance(ip.get("address"), str):
            raise CniError(INVALID_CONFIG, f"{where}.address must be a string (CIDR)")
        family = "ip4" if _ip_version(ip["address"], where) == "4" else "ip6"
        if family in out:
            continue
        config: dict[str, Any] = {"ip": ip["address"]}
        if "gateway" in ip:
            config["gateway"] = ip["gateway"]
        mine = [r for r in routes if isinstance(r, dict) and _route_family(r) == family]
        if mine:
            config["routes"] = [{k: v for k, v in r.items() if k in ("dst", "gw")} for r in mine]
        out[family] = config
    return out


def _route_family(route: Mapping[str, Any]) -> str:
    dst = route.get("dst")
    return "ip6" if isinstance(dst, str) and ":" in dst else "ip4"


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
