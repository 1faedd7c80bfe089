"""One function per CNI command: what is decided here, and what is asked of the agent.

Decided without the agent (the pod passes, ADD returns prevResult): no Kubernetes pod in
CNI_ARGS, a namespace in `exclude_namespaces`, a pod of the agent's DaemonSet (the agent is not
there to ask while one of them starts). Everything else is one
request to the agent, and an agent that is unreachable or fails fails ADD and CHECK (fail
closed: a pod that should be captured must never start uncaptured). One exception: an ADD the
agent does not answer passes a pod plugin/plain.py judges plain (a sidecar-only install, the
pod's annotations handed by the runtime and none of them Istio's), so that an agent outage
stops only the pods that need the agent.

DEL with the agent unreachable succeeds: the runtime retries a failed DEL without end and holds
the pod's teardown meanwhile, while everything our ADD made lives inside the pod's network
namespace, which goes away with the sandbox. State the agent keeps per sandbox is dropped by GC
and by its own reconciliation. An agent that answers DEL with an error still fails it.
"""

from __future__ import annotations

# Both loaded already (plugin.main, plugin.client): no start-up cost here.
import os
import time

from plugin import plain, versions, wire
from plugin.client import AgentClient, AgentUnavailable
from plugin.errors import CniError
from plugin.log import PluginLog
from plugin.skel import parse_cni_args
from plugin.wire import NOT_AVAILABLE

TYPE_CHECKING = False  # not typing's: importing typing costs ~10 ms of start-up
if TYPE_CHECKING:
    from typing import Any, TextIO

    from plugin.config import NetConf
    from plugin.skel import CmdArgs, Command


class Pod:
    """The Kubernetes pod the runtime names in CNI_ARGS."""

    __slots__ = ("name", "namespace", "uid")

    def __init__(self, name: str, namespace: str, uid: str) -> None:
        self.name = name
        self.namespace = namespace
        self.uid = uid


def pod_of(args: CmdArgs) -> Pod | None:
    """The pod in CNI_ARGS (K8S_POD_NAME, K8S_POD_NAMESPACE, K8S_POD_UID), None without one."""
    kv = parse_cni_args(args.args)
    name, namespace = kv.get("K8S_POD_NAME", ""), kv.get("K8S_POD_NAMESPACE", "")
    if not name or not namespace:
        return None
    return Pod(name, namespace, kv.get("K8S_POD_UID", ""))


# A DaemonSet's pods are named `<generateName><5 of bcdfghjklmnpqrstvwxz2456789>`.
_POD_SUFFIX_LEN = 5
_POD_SUFFIX_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789")


def is_agent_pod(conf: NetConf, pod: Pod) -> bool:
    """A pod of the agent's DaemonSet: the agent's namespace, and the name the entry's
    `agent_pod_prefix` plus a 5-character [a-z0-9] suffix (or exactly an older entry's
    `pod_name`). Istio checks the namespace and its DaemonSet's `istio-cni-node-` prefix."""
    if not conf.pod_namespace or pod.namespace != conf.pod_namespace:
        return False
    if conf.pod_name and pod.name == conf.pod_name:
        return True
    prefix = conf.agent_pod_prefix
    if not prefix or not pod.name.startswith(prefix):
        return False
    suffix = pod.name[len(prefix) :]
    return len(suffix) == _POD_SUFFIX_LEN and all(c in _POD_SUFFIX_CHARS for c in suffix)


def pass_reason(conf: NetConf, pod: Pod | None) -> str | None:
    """Why the pod passes without asking the agent, or None when the agent decides."""
    if pod is None:
        return "no Kubernetes pod in CNI_ARGS"
    if pod.namespace in conf.exclude_namespaces:
        return f"namespace {pod.namespace} is excluded"
    if is_agent_pod(conf, pod):
        return "a pod of the istio-cni agent's DaemonSet"
    return None


_STARTTIME_FIELD = 19
"""/proc/PID/stat's field 22 (starttime), counted from the field after the `(comm)` one."""


def process_start() -> float | None:
    """When this process started, in seconds of CLOCK_BOOTTIME; None when /proc cannot tell.

    The kernel's own record (/proc/self/stat starttime, counted on CLOCK_BOOTTIME since boot)
    is the only clock that saw the fork: the exec, the interpreter's start-up and the imports
    before any of our code runs are all in it, and a time taken at `main` would leave them out
    (tens of ms, the most variable part on a loaded node). Its unit is a clock tick (USER_HZ,
    10 ms on Linux), truncated: the start lies somewhere in [tick, tick + 1), so the middle of
    it is taken (at most half a tick off), and never later than now."""
    try:
        fd = os.open("/proc/self/stat", os.O_RDONLY | os.O_CLOEXEC)  # no io object: ~15 us
        try:
            stat = os.read(fd, 4096)
        finally:
            os.close(fd)
        ticks = int(stat[stat.rindex(b")") + 2 :].split()[_STARTTIME_FIELD])
        hz = os.sysconf("SC_CLK_TCK")
        now = time.clock_gettime(time.CLOCK_BOOTTIME)
    except (OSError, ValueError, IndexError, AttributeError):  # AttributeError: no such clock
        return None
    return min((ticks + 0.5) / hz, now)


class Plugin:
    """The commands, writing their log lines to `stderr` (and to the agent)."""

    def __init__(self, *, stderr: TextIO) -> None:
        self.stderr = stderr

    def commands(self) -> dict[str, Command]:
        return {
            "ADD": self.add,
            "CHECK": self.check,
            "DEL": self.delete,
            "GC": self.gc,
            "STATUS": self.status,
        }

    def add(self, args: CmdArgs, conf: NetConf) -> dict[str, Any]:
        # Checked before any decision: a malformed prevResult fails every pod alike.
        result = versions.convert_result(conf.prev_result or {}, conf.cni_version)
        self._ask("ADD", args, conf)
        return result

    def check(self, args: CmdArgs, conf: NetConf) -> None:
        if conf.prev_result is not None:
            versions.convert_result(conf.prev_result, conf.cni_version)
        self._ask("CHECK", args, conf)

    def delete(self, args: CmdArgs, conf: NetConf) -> None:
        self._ask("DEL", args, conf, unreachable_ok=True)

    def gc(self, args: CmdArgs, conf: NetConf) -> None:
        client = AgentClient(conf.agent_run_dir, timeout=conf.agent_timeout)
        reply = client.gc(wire.gc_request(conf.valid_attachments or []))
        self._log(args, conf, None).debug(
            "GC done", attachments=len(conf.valid_attachments or []), reason=reply["reason"]
        )

    def status(self, args: CmdArgs, conf: NetConf) -> None:
        client = AgentClient(conf.agent_run_dir, timeout=conf.agent_timeout)
        try:
            reply = client.status()
        except CniError as e:
            raise CniError(
                NOT_AVAILABLE,
                "the plugin is not available",
                f"{e.msg}: {e.details}" if e.details else e.msg,
            ) from e
        if not reply["ready"]:
            raise CniError(
                NOT_AVAILABLE,
                "the plugin is not available",
                "istio-cni agent not ready: " + reply.get("reason", ""),
            )

    def _ask(
        self, command: str, args: CmdArgs, conf: NetConf, *, unreachable_ok: bool = False
    ) -> None:
        """Decide locally or send the one request; raises CniError when the agent fails
        (or cannot be reached, unless `unreachable_ok`)."""
        pod = pod_of(args)
        reason = pass_reason(conf, pod)
        if reason is not None or pod is None:
            self._log(args, conf, pod).debug(f"{command}: pass", reason=reason)
            return
        client = AgentClient(conf.agent_run_dir, timeout=conf.agent_timeout)
        log = self._log(args, conf, pod)
        try:
            reply = client.cni(
                command,
                wire.cni_request(
                    command=command,
                    container_id=args.container_id,
                    netns=args.netns,
                    ifname=args.ifname,
                    pod_name=pod.name,
                    pod_namespace=pod.namespace,
                    pod_uid=pod.uid,
                    cni_version=conf.cni_version,
                    prev_result=conf.prev_result,
                    started_at=process_start(),
                ),
            )
        except AgentUnavailable as e:
            log.agent_unreachable()  # its lines go to the run dir's file, not another connect
            # CHECK as ADD: CRI-O checks a sandbox's network right after its ADD.
            why = plain.plain_pod(conf) if command in ("ADD", "CHECK") else None
            if why is not None:
                log.warn(
                    f"{command} passes a plain pod without the agent",
                    reason=why,
                    error=e.msg,
                    details=e.details,
                )
                return
            if not unreachable_ok:
                log.error(f"{command} failed", code=e.code, error=e.msg, details=e.details)
                raise
            log.warn(
                f"{command} succeeds without the agent: the netns and its rules go with "
                "the sandbox",
                error=e.msg,
                details=e.details,
            )
            return
        except CniError as e:
            log.error(f"{command} failed", code=e.code, error=e.msg, details=e.details)
            raise
        log.debug(f"{command}: {reply['result']}", reason=reply["reason"])

    def _log(self, args: CmdArgs, conf: NetConf, pod: Pod | None) -> PluginLog:
        """Lines to stderr and to the agent's log (else the run dir's file), tagged with the pod."""
        name, namespace = (pod.name, pod.namespace) if pod else ("", "")
        client = AgentClient(conf.agent_run_dir, timeout=conf.agent_timeout)

        def sink(level: str, msg: str, fields: dict[str, str]) -> bool:
            return client.log(
                wire.log_request(
                    level=level,
                    msg=msg,
                    pod_name=name,
                    pod_namespace=namespace,
                    container_id=args.container_id,
                    fields=fields,
                )
            )

        fields = {
            "pod": f"{namespace}/{name}" if pod else "",
            "containerId": args.container_id,
            "command": args.command,
        }
        return PluginLog(
            conf.log_level,
            stderr=self.stderr,
            fields=fields,
            sink=sink,
            as_json=conf.log_as_json,
            run_dir=conf.agent_run_dir,
        )
