"""The CNI protocol around the commands: environment, stdin, version checks, result or error.

`dispatch` takes the environment and the standard streams as parameters, so tests drive it
without a process. Per command it checks the required `CNI_*` variables, reads and checks the
config, and prints either the command's result or a CNI error object (then returns 1).
"""

from __future__ import annotations

import sys

from plugin import config, fastjson, versions
from plugin.errors import CniError
from plugin.wire import INCOMPATIBLE_VERSION, INTERNAL, INVALID_ENV, IO_FAILURE, UNKNOWN_CONTAINER

TYPE_CHECKING = False  # not typing's: importing typing costs ~10 ms of start-up
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any, BinaryIO, TextIO

    from plugin.config import NetConf

    Command = Callable[["CmdArgs", NetConf], "dict[str, Any] | None"]

ABOUT = "istio-cni: Istio CNI plugin (redirects pod traffic to the sidecar via the node agent)"
_ENV = ("CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH")
REQUIRED: dict[str, tuple[str, ...]] = {
    "ADD": _ENV,
    "CHECK": _ENV,
    "DEL": ("CNI_CONTAINERID", "CNI_IFNAME", "CNI_PATH"),
    "GC": ("CNI_PATH",),
    "STATUS": ("CNI_PATH",),
    "VERSION": (),
}
"""Variables each command needs (as libcni's skeleton checks them); CNI_ARGS is always optional."""
MIN_VERSION = {
    "CHECK": versions.CHECK_SINCE,
    "GC": versions.GC_STATUS_SINCE,
    "STATUS": versions.GC_STATUS_SINCE,
}


class CmdArgs:
    """What the runtime passed in the environment, plus the raw stdin."""

    __slots__ = ("args", "command", "container_id", "ifname", "netns", "path", "stdin")

    def __init__(self, environ: Mapping[str, str], stdin: bytes) -> None:
        self.command = environ.get("CNI_COMMAND", "")
        self.container_id = environ.get("CNI_CONTAINERID", "")
        self.netns = environ.get("CNI_NETNS", "")
        self.ifname = environ.get("CNI_IFNAME", "")
        self.args = environ.get("CNI_ARGS", "")
        self.path = environ.get("CNI_PATH", "")
        self.stdin = stdin


def parse_cni_args(args: str) -> dict[str, str]:
    """`CNI_ARGS` ("K=V;K2=V2") as a dict; a pair without '=' is an error naming it."""
    out: dict[str, str] = {}
    for pair in args.split(";"):
        if not pair:
            continue
        k, sep, v = pair.partition("=")
        if not sep or not k:
            raise CniError(INVALID_ENV, f"CNI_ARGS: invalid pair {pair!r} (want KEY=VALUE)")
        out[k] = v
    return out


def dispatch(
    commands: Mapping[str, Command],
    *,
    environ: Mapping[str, str],
    stdin: BinaryIO,
    stdout: TextIO,
    stderr: TextIO,
) -> int:
    """Run the command named by CNI_COMMAND; returns the exit code (0 or 1)."""
    version = versions.LATEST
    try:
        cmd = _check_env(environ, stderr)
        data = _read(stdin)
        if cmd == "VERSION":
            _print(stdout, versions.version_info(_requested_version(data)))
            return 0
        args = CmdArgs(environ, data)
        _check_ids(args)
        conf = config.parse(data, command=cmd)
        version = conf.cni_version
        _check_version(cmd, version)
        result = commands[cmd](args, conf)
        if result is not None:
            _print(stdout, result)
        return 0
    except CniError as e:
        return _fail(stdout, e, version)
    except Exception as e:  # the runtime must always get an error object, never a traceback
        import traceback

        traceback.print_exc(file=stderr)
        return _fail(
            stdout, CniError(INTERNAL, f"internal error: {type(e).__name__}: {e}"), version
        )


def _check_env(environ: Mapping[str, str], stderr: TextIO) -> str:
    cmd = environ.get("CNI_COMMAND", "")
    if not cmd:
        print(ABOUT, file=stderr)
        print("CNI protocol versions supported: " + ", ".join(versions.SUPPORTED), file=stderr)
        raise CniError(INVALID_ENV, "required env variables [CNI_COMMAND] missing")
    if cmd not in REQUIRED:
        raise CniError(
            INVALID_ENV, f"unknown CNI_COMMAND: {cmd}", f"known commands: {', '.join(REQUIRED)}"
        )
    missing = [name for name in REQUIRED[cmd] if not environ.get(name)]
    if missing:
        raise CniError(
            INVALID_ENV,
            f"required env variables [{','.join(missing)}] missing",
            f"CNI_COMMAND={cmd}",
        )
    return cmd


def _check_ids(args: CmdArgs) -> None:
    if args.command in ("GC", "STATUS"):
        return
    if not args.container_id:
        raise CniError(UNKNOWN_CONTAINER, "missing containerID")
    if not config.is_name(args.container_id):
        raise CniError(INVALID_ENV, "invalid characters in CNI_CONTAINERID", args.container_id)
    name = args.ifname
    if (
        len(name) > 15
        or name in (".", "..")
        or any(c in name for c in "/:")
        or any(c.isspace() for c in name)
    ):
        raise CniError(
            INVALID_ENV,
            f"invalid CNI_IFNAME {name!r}",
            "at most 15 characters, not '.' or '..', no '/', ':' or whitespace",
        )


def _check_version(cmd: str, version: str) -> None:
    minimum = MIN_VERSION.get(cmd)
    if minimum and not versions.at_least(version, minimum):
        raise CniError(
            INCOMPATIBLE_VERSION,
            f"config version {version} does not allow {cmd}",
            f"{cmd} needs cniVersion {minimum} or later",
        )


def _read(stdin: BinaryIO) -> bytes:
    try:
        return stdin.read()
    except OSError as e:
        raise CniError(IO_FAILURE, f"error reading from stdin: {e}") from e


def _requested_version(data: bytes) -> object:
    try:
        obj = fastjson.loads(data) if data.strip() else None
    except (ValueError, UnicodeDecodeError):
        return None
    return obj.get("cniVersion") if isinstance(obj, dict) else None


def _print(stdout: TextIO, obj: object) -> None:
    stdout.write(fastjson.dumps(obj) + "\n")
    stdout.flush()


def _fail(stdout: TextIO, error: CniError, version: str) -> int:
    try:
        _print(stdout, error.to_object(version))
    except OSError:
        print(f"istio-cni: cannot write error to stdout: {error.msg}", file=sys.stderr)
    return 1
