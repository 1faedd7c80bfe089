"""What a soak needs of a test bed, as a protocol: the run drives any bed that offers it.

A bed starts nodes with the chart's agents on them, churns pods (sidecar and ambient
namespaces) and reports each pod's start and capture as events, samples the agents' processes,
looks at each node's CNI files, builds the faults of the catalogue on its parts, and at the end
scans the nodes for what no pod owns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from bench.soak.faults import Fault, FaultKind
from bench.soak.procstats import AgentSample


class BedUnavailable(RuntimeError):
    """The bed cannot run here: the message names what is missing."""


@dataclass(frozen=True)
class PodEvent:
    """A churn pod seen by the bed. `running` None: still waiting at `at`; `captured` None:
    not looked at yet (sidecar: Istio's rules in its netns; ambient: enrolled with ztunnel),
    else what was seen at `at`, which for a new pod is its first instant Running."""

    at: float
    name: str
    node: str
    mode: str
    created: float
    running: float | None
    captured: bool | None
    phases: dict[str, float] = field(default_factory=dict)
    """testbed/churn.py ChurnPod.phases: seconds from creation to scheduled and to sandbox."""


@dataclass(frozen=True)
class FilesState:
    node: str
    working: bool
    detail: str


class Bed(Protocol):
    """Times are seconds on the run's clock (time.monotonic() minus the run's start, which the
    run passes to `start`)."""

    @property
    def nodes(self) -> Sequence[str]: ...

    def lacks(self) -> dict[str, str]:
        """Kinds of the catalogue this bed cannot fire, each with why (beyond those the
        catalogue itself declares unavailable)."""

    def targets(self) -> dict[str, list[str]]:
        """Kinds of node faults that may hit only some of `nodes` (a reboot: never the node
        holding the control plane), each with those nodes; a kind not named may hit any."""

    def start(self) -> None:
        """Nodes up, the chart installed, every agent Ready."""

    def begin(self, epoch: float) -> None:
        """Pod churn begun; event times from here on are seconds since `epoch`."""

    def fault(self, kind: FaultKind, node: str | None) -> Fault: ...

    def pod_events(self) -> list[PodEvent]:
        """The events since the last call."""

    def agent_samples(self) -> list[AgentSample]: ...

    def files(self) -> list[FilesState]: ...

    def uninstalls(self) -> list[tuple[float, str, str]]:
        """(at, node, what) for every uninstall an agent did since the last call."""

    def drain(self) -> None:
        """Churn stopped, its pods deleted and waited away (their events still reported)."""

    def leftovers(self) -> list[str]:
        """After drain(): what the nodes hold that no pod owns (netns, veths, chains, nft
        tables, ipset members, cgroups, files), one line each."""

    def stop(self) -> None:
        """The bed torn down, whatever state it is in."""
