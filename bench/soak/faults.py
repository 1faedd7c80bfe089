"""The fault catalogue, as data, and the protocol every fault of a run follows.

A fault has a window: `start()` breaks something, `stop()` ends the breaking (for an instant
fault such as a kill -9, nothing: the damage is done at start), then the run polls
`recovered()` until the bed is whole again (the agent Ready, its entry loaded, the API server
answering). The time from the end of the breaking (`stop()`, or `start()` for an instant fault)
to `recovered()` is the fault's recovery time in the report.

A kind the bed cannot produce yet is declared here with the reason (`unavailable`), so that the
CLI lists it rather than pretending to have fired it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

Scope = Literal["node", "cluster"]


class Fault(Protocol):
    """One fault of a run, on one node (`nodes` == (name,)) or on the cluster (`nodes` == ():
    every node is affected)."""

    @property
    def kind(self) -> str: ...

    @property
    def nodes(self) -> tuple[str, ...]: ...

    @property
    def instant(self) -> bool:
        """Done at start (recovery counts from there), else held until stop()."""

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def recovered(self) -> bool: ...


@dataclass(frozen=True)
class FaultKind:
    name: str
    what: str
    scope: Scope
    seconds: float
    """How long the window is held (for an instant fault: how long before the next fault of
    its group may start on the same target)."""
    group: str = ""
    """Kinds of one group never overlap on one target (they drive the same part: the API fault
    proxy holds one fault at a time, Helm one operation per release). Empty: the kind alone."""
    excludes: tuple[str, ...] = ()
    """Other groups (a kind without one: its name) that never overlap this kind on a target,
    either way: a rebooting node has no agent process to kill or throttle."""
    touches_files: bool = False
    """The fault itself breaks the node's CNI files: a broken config sampled while it is active
    is the fault, not a violation (the time to heal it is its recovery time)."""
    unavailable: str = ""
    """Why today's bed cannot produce this kind; empty when it can."""

    @property
    def available(self) -> bool:
        return not self.unavailable

    @property
    def exclusive(self) -> str:
        return self.group or self.name


CATALOGUE: tuple[FaultKind, ...] = (
    FaultKind(
        "agent_kill9", "the agent's process killed with SIGKILL", "node", 10.0, group="agent"
    ),
    FaultKind(
        "agent_pod_delete",
        "the agent's pod deleted (the DaemonSet makes another)",
        "node",
        20.0,
        group="agent",
    ),
    FaultKind(
        "runtime_restart",
        "containerd stopped and started, containers kept",
        "node",
        15.0,
        group="runtime",
    ),
    FaultKind(
        "node_reboot",
        "the node hard-rebooted: every process killed, run dirs emptied, pods recreated",
        "node",
        60.0,
        group="runtime",
        excludes=("agent", "agent_cpu_throttle"),
    ),
    FaultKind(
        "api_stopped", "kube-apiserver stopped, then started again", "cluster", 20.0, group="api"
    ),
    FaultKind(
        "api_silence",
        "the API server reads requests and answers nothing",
        "cluster",
        20.0,
        group="api",
    ),
    FaultKind(
        "api_429", "every API request answered 429 with Retry-After 5", "cluster", 20.0, group="api"
    ),
    FaultKind("api_401", "every API request answered 401", "cluster", 20.0, group="api"),
    FaultKind("etcd_restart", "etcd stopped and started again on its data", "cluster", 15.0),
    FaultKind(
        "conflist_rewrite",
        "the primary CNI rewrites its conflist (without our entry)",
        "node",
        5.0,
        group="conflist",
        touches_files=True,
    ),
    FaultKind(
        "conflist_delete",
        "the primary CNI deletes its conflist, then writes it again",
        "node",
        5.0,
        group="conflist",
        touches_files=True,
    ),
    FaultKind(
        "plugin_delete",
        "the plugin binary deleted from the CNI bin dir",
        "node",
        5.0,
        touches_files=True,
    ),
    FaultKind(
        "helm_upgrade",
        "`helm upgrade` of the chart (a new pod template)",
        "cluster",
        30.0,
        group="helm",
    ),
    FaultKind(
        "helm_rollback",
        "`helm rollback` of the chart to its previous revision",
        "cluster",
        30.0,
        group="helm",
    ),
    FaultKind(
        "ztunnel_restart", "the ztunnel stand-in restarts (fresh process, no state)", "node", 10.0
    ),
    FaultKind(
        "conf_dir_full",
        "the conf dir's file system filled to its last byte",
        "node",
        20.0,
        touches_files=True,
    ),
    FaultKind("agent_cpu_throttle", "the agent's cgroup held to 2% of a CPU", "node", 30.0),
)


def catalogue_by_name(catalogue: Sequence[FaultKind] = CATALOGUE) -> dict[str, FaultKind]:
    return {k.name: k for k in catalogue}


def available(catalogue: Sequence[FaultKind] = CATALOGUE) -> list[FaultKind]:
    return [k for k in catalogue if k.available]


def unavailable(catalogue: Sequence[FaultKind] = CATALOGUE) -> list[FaultKind]:
    return [k for k in catalogue if not k.available]


class Instant:
    """A fault done at start (a kill, a deletion, a Helm operation): stop() has nothing to end;
    recovered when `healthy` says the affected nodes are whole."""

    def __init__(
        self,
        kind: str,
        nodes: tuple[str, ...],
        act: Callable[[], None],
        healthy: Callable[[], bool],
    ) -> None:
        self._kind, self._nodes = kind, nodes
        self._act, self._healthy = act, healthy

    @property
    def kind(self) -> str:
        return self._kind

    @property
    def nodes(self) -> tuple[str, ...]:
        return self._nodes

    @property
    def instant(self) -> bool:
        return True

    def start(self) -> None:
        self._act()

    def stop(self) -> None:
        """Nothing to end: the damage was done at start."""

    def recovered(self) -> bool:
        return self._healthy()


class Held:
    """A fault held from start to stop (a full disk, a throttled CPU, an API server answering
    429): `end` undoes what `begin` did; recovered once ended and `healthy`."""

    def __init__(
        self,
        kind: str,
        nodes: tuple[str, ...],
        begin: Callable[[], None],
        end: Callable[[], None],
        healthy: Callable[[], bool],
    ) -> None:
        self._kind, self._nodes = kind, nodes
        self._begin, self._end, self._healthy = begin, end, healthy
        self._held = False

    @property
    def kind(self) -> str:
        return self._kind

    @property
    def nodes(self) -> tuple[str, ...]:
        return self._nodes

    @property
    def instant(self) -> bool:
        return False

    def start(self) -> None:
        self._begin()
        self._held = True

    def stop(self) -> None:
        if self._held:
            self._held = False
            self._end()

    def recovered(self) -> bool:
        return not self._held and self._healthy()
