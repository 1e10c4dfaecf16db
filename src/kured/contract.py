"""The agent's contracts: the protocols the loop drives (gates, this node's Kubernetes object,
the window), its configuration, and the view it keeps for ``kured status`` and metrics.

Kept apart from ``kured.loop`` so the loop and the node choreography (``kured.choreography``)
share them without importing each other.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from kured.core.policy import Decision, GateResult, Observation


class Gate(Protocol):
    name: str

    async def check(self) -> GateResult: ...


class NodeActuator(Protocol):
    """This node's Kubernetes object (``kured.actuators.node.KubernetesNode``). Every method
    may raise ``KuredError``; cordon/drain/uncordon raise ``DrainError``."""

    async def unschedulable(self) -> bool: ...

    async def cordon(self) -> bool: ...

    async def uncordon(self) -> None: ...

    async def drain(self) -> object: ...

    async def undo_own_cordon(self) -> bool: ...

    async def undo_orphaned_cordon(self) -> bool: ...

    async def apply_labels(self, when: str) -> bool: ...

    async def note_reboot_needed(self, at: datetime) -> bool: ...

    async def clear_reboot_in_progress(self) -> bool: ...

    async def prefer_no_schedule(self, on: bool) -> bool: ...


class Notify(Protocol):
    """``kured.actuators.notify.Notifier``: ``send`` never blocks nor raises for a delivery
    problem; ``flush`` waits for deliveries in flight, bounded by their timeout."""

    def send(self, event: str) -> None: ...

    def sends(self, event: str) -> bool: ...

    async def flush(self) -> None: ...


class DeletedHolderCheck(Protocol):
    """``kured.actuators.deleted_nodes.DeletedHolders``: releases the lock of holders whose
    Node is gone; returns their ids; never raises."""

    released_total: int

    async def check(self, holders: Iterable[str]) -> list[str]: ...


class Window(Protocol):
    def contains(self, instant: datetime) -> bool: ...

    def next_open(self, after: datetime) -> datetime | None: ...


@dataclass
class AgentConfig:
    node_id: str
    period_seconds: float
    lock_ttl_seconds: float
    lock_release_delay_seconds: float
    max_consecutive_reboots: int
    force_reboot: bool = False  # reboot even when the cordon or drain failed
    drain_delay_seconds: float = 0.0  # --drain-delay: after the pre labels, before the cordon
    reboot_delay_seconds: float = 0.0  # --reboot-delay: after the drain, before the reboot
    # A failed uncordon is retried after a pause drawn from [½p, p), p doubling up to the cap.
    uncordon_backoff_initial_seconds: float = 1.0
    uncordon_backoff_cap_seconds: float = 60.0
    # --min-reboot-interval: after an attempt that did not clear the sentinel (still required
    # after the reboot, or the reboot command failed), none before this much later; 0 = off.
    min_reboot_interval_seconds: float = 0.0


@dataclass(frozen=True)
class DrainFailure:
    """The last failed cordon or drain: when (unix seconds), why, the pods left, and what the
    agent did about it (``action``: "released" or "rebooting anyway")."""

    at: float
    message: str
    pods: tuple[str, ...]
    action: str


@dataclass
class MaintenanceView:
    """The maintenance around a reboot (``kured.maintenance``), for ``kured status`` and
    metrics: the silence held (id, end in unix seconds), what the maintenance waits for, the
    last hook failure, and hook runs by ``(event, result)``."""

    silence_id: str = ""
    silence_ends_at: float | None = None
    phase: str = ""
    last_hook_failure: tuple[float, str] | None = None
    hooks_total: dict[tuple[str, str], int] = field(default_factory=dict)

    def hook_ran(self, event: str, result: str) -> None:
        key = (event, result)
        self.hooks_total[key] = self.hooks_total.get(key, 0) + 1


@dataclass
class AgentView:
    """The last observation and decision, for ``kured status`` and metrics."""

    observation: Observation | None = None
    decision: Decision | None = None
    failures_total: dict[str, int] = field(default_factory=dict)
    decisions_total: dict[str, int] = field(default_factory=dict)
    last_tick_at: float | None = None
    next_check_at: float | None = None  # unix seconds of the next (or first) check
    last_drain_failure: DrainFailure | None = None
    maintenance: MaintenanceView = field(default_factory=MaintenanceView)

    def fail(self, kind: str) -> None:
        self.failures_total[kind] = self.failures_total.get(kind, 0) + 1


Sleep = Callable[[float], Awaitable[None]]
