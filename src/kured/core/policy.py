"""The reboot decision: one pure function from an observation to a decision with its reasons.

``decide(obs)`` never performs IO and never looks at the clock itself; the agent loop observes
the world, calls it, and acts on the answer. Its invariants (property-tested):

* it never answers ``REBOOT`` outside the window, while a gate blocks or cannot answer, while
  the sentinel is unknown or says no, while the circuit breaker is open, before
  ``--min-reboot-interval`` has passed since a reboot attempt that did not clear the sentinel
  (``held_off_until``: field reports B39 and B40), or without holding the lock;
* it never answers ``ACQUIRE`` unless everything except the lock already allows a reboot, so a
  blocked node never sits on the lock (kured #792: the lock was taken before the blockers ran);
* after this node triggered a reboot it answers ``HOLD``: it keeps the lock and does nothing
  else until the machine goes down (kured §2.9);
* a node that holds the lock from before a restart, with no reboot pending in this process,
  answers ``RELEASE`` regardless of the window (kured's phase A: the reboot happened).

The order of checks follows kured's main loop (window → sentinel → gates → lock), so the first
blocking reason is the one kured users would expect to read.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime


class Action(enum.Enum):
    """What the agent should do now. Values are metric label values."""

    NOTHING = "nothing"  # no reboot needed, or blocked: see the reasons
    ACQUIRE = "acquire"  # everything allows a reboot except that we do not hold the lock
    REBOOT = "reboot"  # we hold the lock and everything allows it: trigger the reboot
    RELEASE = "release"  # we hold a lock we no longer need (rebooted, or now blocked)
    HOLD = "hold"  # a reboot was triggered: keep the lock, do nothing else


@dataclass(frozen=True)
class GateResult:
    """One gate's answer. ``blocking`` None means the gate could not answer (fail-closed)."""

    name: str
    blocking: bool | None
    detail: str = ""


@dataclass(frozen=True)
class Observation:
    """Everything the decision needs, gathered by the loop at one instant."""

    now: datetime
    reboot_required: bool | None  # None: the sentinel could not answer
    sentinel_detail: str
    window_open: bool
    gates: tuple[GateResult, ...]
    holds_lock: bool | None  # None: the lock could not be read
    lock_holders: tuple[str, ...]
    reboot_triggered: bool = False  # this process triggered a reboot
    rebooted_holding_lock: bool = False  # we restarted after a reboot we triggered, lock held
    breaker_open: bool = False
    breaker_detail: str = ""
    next_window_at: datetime | None = None
    # Set while a reboot is required but the last attempt did not clear the sentinel and
    # ``--min-reboot-interval`` has not passed since (kured.loop): no attempt before then.
    held_off_until: datetime | None = None
    held_off_detail: str = ""


class Why(enum.Enum):
    """Closed set of reason kinds: the label of ``kured_blocking_reason``."""

    NONE = "none"
    REBOOT_TRIGGERED = "reboot_triggered"
    REBOOTED = "rebooted"
    BREAKER_OPEN = "breaker_open"
    MIN_REBOOT_INTERVAL = "min_reboot_interval"
    OUTSIDE_WINDOW = "outside_window"
    SENTINEL_UNKNOWN = "sentinel_unknown"
    NOT_REQUIRED = "not_required"
    GATE_BLOCKED = "gate_blocked"
    GATE_UNKNOWN = "gate_unknown"
    LOCK_UNKNOWN = "lock_unknown"
    LOCK_HELD_ELSEWHERE = "lock_held_elsewhere"
    LOCK_NOT_HELD = "lock_not_held"
    # Set by the agent, not by ``decide``: the cordon or drain failed and the attempt was
    # given up (lock released at once, node restored); the next tick tries again.
    DRAIN_FAILED = "drain_failed"
    # Set by the agent: the uncordon before a release failed; it is retried with backoff and
    # the lock is kept meanwhile.
    UNCORDON_FAILED = "uncordon_failed"
    # Set by the agent (kured.maintenance), after the lock is taken and before the drain: the
    # Alertmanager silence could not be created, or the pre-drain hook failed. The lock is
    # given back at once, nothing was touched on the node, the next check tries again.
    SILENCE_FAILED = "silence_failed"
    PRE_DRAIN_HOOK_FAILED = "pre_drain_hook_failed"


@dataclass(frozen=True)
class Reason:
    why: Why
    text: str


@dataclass(frozen=True)
class Decision:
    action: Action
    reasons: tuple[Reason, ...] = field(default_factory=tuple)

    @property
    def first(self) -> str:
        """The first reason's text, or '' (what ``kured status`` shows first)."""
        return self.reasons[0].text if self.reasons else ""

    @property
    def why(self) -> Why:
        return self.reasons[0].why if self.reasons else Why.NONE


def decide(obs: Observation) -> Decision:
    """The decision for ``obs`` (see module docstring for the invariants)."""
    if obs.reboot_triggered:
        return Decision(
            Action.HOLD,
            (Reason(Why.REBOOT_TRIGGERED, "reboot triggered: waiting for the machine to go down"),),
        )
    if obs.rebooted_holding_lock:
        return Decision(
            Action.RELEASE, (Reason(Why.REBOOTED, "rebooted: releasing the lock after the delay"),)
        )
    reasons = _blocking_reasons(obs)
    if reasons:
        if obs.holds_lock:
            # Never sit on the lock while we cannot use it (kured #792).
            return Decision(Action.RELEASE, tuple(reasons))
        return Decision(Action.NOTHING, tuple(reasons))
    if obs.holds_lock is None:
        return Decision(
            Action.NOTHING, (Reason(Why.LOCK_UNKNOWN, "blocked: the lock could not be read"),)
        )
    if not obs.holds_lock:
        if obs.lock_holders:
            text = "waiting for the lock, held by " + ", ".join(obs.lock_holders)
            return Decision(Action.ACQUIRE, (Reason(Why.LOCK_HELD_ELSEWHERE, text),))
        return Decision(Action.ACQUIRE, (Reason(Why.LOCK_NOT_HELD, "taking the lock"),))
    return Decision(Action.REBOOT, ())


def _blocking_reasons(obs: Observation) -> list[Reason]:
    """Everything that forbids a reboot right now, in kured's check order."""
    if obs.breaker_open:
        return [Reason(Why.BREAKER_OPEN, f"blocked: circuit breaker open: {obs.breaker_detail}")]
    if obs.held_off_until is not None:
        return [
            Reason(
                Why.MIN_REBOOT_INTERVAL,
                f"blocked: {obs.held_off_detail}; no new attempt before "
                f"{obs.held_off_until.isoformat()} (--min-reboot-interval)",
            )
        ]
    if not obs.window_open:
        when = f" (next opening {obs.next_window_at.isoformat()})" if obs.next_window_at else ""
        return [Reason(Why.OUTSIDE_WINDOW, f"blocked: outside the reboot window{when}")]
    if obs.reboot_required is None:
        return [Reason(Why.SENTINEL_UNKNOWN, f"blocked: sentinel unknown: {obs.sentinel_detail}")]
    if not obs.reboot_required:
        return [Reason(Why.NOT_REQUIRED, f"no reboot required: {obs.sentinel_detail}")]
    reasons = []
    for gate in obs.gates:
        if gate.blocking is None:
            reasons.append(Reason(Why.GATE_UNKNOWN, f"blocked: {gate.name} unknown: {gate.detail}"))
        elif gate.blocking:
            reasons.append(Reason(Why.GATE_BLOCKED, f"blocked: {gate.detail}"))
    return reasons
