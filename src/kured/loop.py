"""The agent: observe → decide → act, once per tick, with time injected.

The agent checks once at start-up, then at a uniformly random point in [½P, 1½P), then every
P: kured waits the jittered interval before its first check, so a freshly started agent showed
nothing for up to 1½ periods (issue 15); the jitter after the first check still keeps the agents
of a fleet from reaching for the lock in step. A decision is logged when its action or reason
changes, not every period. One tick:

Every clock read and every sleep (the period, the delays, the backoffs) goes through the injected
``clock`` (``kit.clock``), so the loop runs on virtual time.

1. **Observe**: the window at now, the sentinel, every gate, the lock's holders.
2. **Decide**: ``kured.core.policy.decide`` — pure.
3. **Act**: acquire the lock (and decide again at once, so a granted lock reboots in the same
   tick), release it (after ``--lock-release-delay`` when it is the post-reboot release), or
   trigger the reboot (recording that first) and then hold everything until the machine goes
   down.

On start (kured's phase A) a reboot this agent triggered earlier is recognised from its state
file, and confirmed by the kernel's boot ID (``kured.state``): the circuit breaker is updated,
and if the lock is still ours it is released after the release delay regardless of the window.
The delay counts from when the agent first came back (``AgentState.came_back_at``), so a restart
during the delay sleeps only what is left. When the boot ID is unchanged the machine did not
reboot: nothing is released as if it had; the attempt is counted towards the circuit breaker
(``kured_failures_total{kind="reboot"}``) and the normal decision runs with the lock still held
- it reboots again when everything still allows it, or restores the node and releases the lock
when something now blocks. A reboot attempt that did not clear the sentinel (the machine came
back with a new boot ID and a reboot is still required, or the reboot command failed) counts
towards the breaker and holds further attempts off for ``--min-reboot-interval``
(``held_off_until`` in the state file; field reports B39, B40). Errors in a tick are logged,
counted and the tick ends; they never escape the loop.

With the Kubernetes backend the agent also has a ``NodeActuator`` (``node``) and follows
kured's node choreography: its rules and their sources are in ``kured.choreography``.

With ``--notify-url`` (``notifier``) kured's three messages go out: drain (before the cordon),
reboot (right before the reboot; the agent waits for it at most the delivery timeout) and
uncordon (after the reboot, once the node is uncordoned; not when it stays cordoned because
it was cordoned before the lock). Delivery never blocks or fails a reboot
(``kured.actuators.notify``).

Around a reboot (``kured.maintenance``, a base class of ``Agent`` too): before the drain the
Alertmanager silence and the pre-drain hook (either failing blocks the reboot and gives the lock
back), and once the node is back (uncordoned, its gates passing again, checked after each tick)
the post-uncordon hook, the "back" message and the silence's expiry; a reboot given up, or not
found on start, expires the silence.

The node steps are in ``kured.choreography`` (a base class of ``Agent``); the protocols, the
configuration and the view are in ``kured.contract`` and re-exported here.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta

from kit.clock import Clock
from kured.actuators.reboot import Rebooter
from kured.choreography import NodeSteps
from kured.contract import (
    AgentConfig,
    AgentView,
    DeletedHolderCheck,
    DrainFailure,
    Gate,
    NodeActuator,
    Notify,
    Window,
)
from kured.core.errors import KuredError, LockError, RebootError, SensorError
from kured.core.policy import Action, Decision, Observation, Why, decide
from kured.locks.base import Lock
from kured.lockview import LockView
from kured.maintenance import MaintenanceKit, MaintenanceSteps
from kured.sensors.sentinel import Sentinel
from kured.state import AgentState, StateStore, current_boot_id

log = logging.getLogger(__name__)


__all__ = [
    "Agent",
    "AgentConfig",
    "AgentView",
    "DrainFailure",
    "Gate",
    "NodeActuator",
    "Window",
    "until_window",
]


# How far into a window's opening an agent's check may fall (``until_window``), at most a
# quarter of the period: enough to spread a fleet's lock and API requests, small against a window.
WINDOW_SPREAD_SECONDS = 60.0


class Agent(NodeSteps, MaintenanceSteps):
    def __init__(
        self,
        config: AgentConfig,
        *,
        window: Window,
        sentinel: Sentinel,
        gates: Sequence[Gate],
        lock: Lock,
        rebooter: Rebooter,
        state: StateStore,
        clock: Clock,
        rng: random.Random | None = None,
        node: NodeActuator | None = None,
        boot_id: Callable[[], str] = current_boot_id,
        notifier: Notify | None = None,
        deleted_holders: DeletedHolderCheck | None = None,
        maintenance: MaintenanceKit | None = None,
    ) -> None:
        self.config = config
        self.window = window
        self.sentinel = sentinel
        self.gates = tuple(gates)
        self.lock = lock
        self.rebooter = rebooter
        self.store = state
        self.clock = clock
        self.sleep = clock.sleep
        self.rng = rng or random.Random()
        self.state = AgentState()
        self.reboot_triggered = False
        self.rebooted_holding_lock = False
        self.view = AgentView()
        self.node = node
        self.boot_id = boot_id
        self.lock_view = LockView(lock, clock)
        # Look for an orphaned cordon of ours until one check succeeds (start, failed uncordon).
        self.orphan_check_pending = node is not None
        self.tainted: bool | None = None  # our PreferNoSchedule taint as last set; None: unknown
        self.notifier = notifier
        self.deleted_holders = deleted_holders
        self.maintenance = maintenance or MaintenanceKit()
        self.silence_sweep_pending = False  # an expiry of our silences failed: retry each tick
        self._keeper: asyncio.Task[None] | None = None  # extends the silence (kured.maintenance)

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.clock.now_ms() / 1000, tz=UTC)

    # -- start-up (kured's phase A) -------------------------------------------------------------

    async def recover(self) -> None:
        """Recognise a reboot this agent triggered before this start, then carry on or abandon
        the maintenance around it (``kured.maintenance``)."""
        await self._recover_reboot()
        await self._recover_maintenance()

    async def _recover_reboot(self) -> None:
        self.state = self.store.load()
        if self.node is not None:
            try:
                holders = await self.lock.holders()
                holds = any(
                    h.node_id == self.config.node_id and not h.expired(self.now()) for h in holders
                )
            except LockError as exc:
                log.warning("cannot read the lock at start: %s", exc.message)
            else:
                await self._check_orphaned_cordon(holds)
        if self.state.came_back_at is not None:
            left = self.config.lock_release_delay_seconds - (self._unix() - self.state.came_back_at)
            log.info(
                "restarted during post-reboot recovery (back since %s): %.1fs of "
                "--lock-release-delay left before releasing the lock",
                datetime.fromtimestamp(self.state.came_back_at, tz=UTC).isoformat(),
                max(0.0, left),
            )
            self.rebooted_holding_lock = True
            return
        if self.state.reboot_triggered_at is None:
            return
        if self._reboot_did_not_happen():
            return
        log.info("started after a reboot triggered at %s", self.state.reboot_triggered_at)
        self.state.last_reboot_at = self.state.reboot_triggered_at
        self.state.reboot_triggered_at = None
        self.state.came_back_at = self._unix()
        try:
            still_required, detail = await self.sentinel.check()
        except SensorError as exc:
            still_required, detail = False, exc.message
        if still_required:
            self.state.consecutive_reboots += 1
            log.warning(
                "after reboot %d in a row a reboot is still required (%s)",
                self.state.consecutive_reboots,
                detail,
            )
            self._check_breaker()
            self._hold_off(f"the reboot this agent triggered did not clear the sentinel ({detail})")
        else:
            self.state.consecutive_reboots = 0
        self.store.save(self.state)
        self.rebooted_holding_lock = True  # release if the lock is still ours

    def _reboot_did_not_happen(self) -> bool:
        """True (and the attempt recorded as failed) when the boot ID recorded before the reboot
        is still the current one: the process restarted, the machine did not."""
        before, now = self.state.boot_id, self.boot_id()
        if not before or not now:
            log.warning("no boot ID to confirm the reboot triggered earlier: assuming it happened")
            return False
        if before != now:
            return False
        self.state.reboot_triggered_at = None
        self.state.consecutive_reboots += 1
        self.view.fail("reboot")
        log.error(
            "the reboot triggered earlier did not happen (boot ID %s unchanged); not releasing "
            "the lock as after a reboot: deciding again with the lock held (attempt %d in a row)",
            now,
            self.state.consecutive_reboots,
        )
        self._check_breaker()
        self.store.save(self.state)
        return True

    def _check_breaker(self) -> None:
        if self.state.consecutive_reboots >= self.config.max_consecutive_reboots:
            self.state.breaker_open = True
            log.error(
                "circuit breaker open: %d reboots in a row did not clear the "
                "sentinel; not rebooting again until an operator looks",
                self.state.consecutive_reboots,
            )

    def _hold_off(self, why: str) -> None:
        """No reboot attempt for ``--min-reboot-interval`` after one that did not clear the
        sentinel (the caller saves the state). Field report B39 (kured #976: a negated sentinel
        command whose tool was missing said "required" after every boot and the node rebooted
        hourly for two days) and B40 (a failing reboot command drained the node every period).
        Counted as ``kured_failures_total{kind="reboot_loop"}``."""
        interval = self.config.min_reboot_interval_seconds
        if interval <= 0:
            return
        self.state.held_off_until = self._unix() + interval
        self.view.fail("reboot_loop")
        log.error(
            "%s: no new reboot attempt before %s (--min-reboot-interval %gs)",
            why,
            datetime.fromtimestamp(self.state.held_off_until, tz=UTC).isoformat(),
            interval,
        )

    def _unix(self) -> float:
        return self.clock.now_ms() / 1000

    # -- one tick --------------------------------------------------------------------------------

    async def observe(self) -> Observation:
        now = self.now()
        window_open = self.window.contains(now)
        try:
            required, detail = await self.sentinel.check()
            reboot_required: bool | None = required
        except SensorError as exc:
            reboot_required, detail = None, exc.message
            self.view.fail("sentinel")
        gates = []
        if window_open and reboot_required and self.node is not None:
            try:
                await self.node.note_reboot_needed(now)
            except KuredError as exc:
                log.warning("cannot annotate the node: %s", exc.message)
                self.view.fail("node")
        if window_open and reboot_required:
            gates = list(await asyncio.gather(*(g.check() for g in self.gates)))
            for g in gates:
                if g.blocking is None:
                    self.view.fail("gate")
        holds: bool | None
        try:
            holders = await self.lock_view.refresh()
            live = [h for h in holders if not h.expired(now)]
            holds = any(h.node_id == self.config.node_id for h in live)
        except LockError as exc:
            log.warning("cannot read the lock: %s", exc.message)
            holds, live = None, []
            self.view.fail("lock")
        if self.rebooted_holding_lock and holds is False:
            self.rebooted_holding_lock = False  # nothing to release
            self._recovery_done()
        await self._check_orphaned_cordon(holds)
        breaker = self.state.breaker_open and bool(reboot_required)
        until = self.state.held_off_until
        held_off = bool(reboot_required) and until is not None and self._unix() < until
        return Observation(
            now=now,
            reboot_required=reboot_required,
            sentinel_detail=detail,
            window_open=window_open,
            gates=tuple(gates),
            holds_lock=holds,
            lock_holders=tuple(h.node_id for h in live if h.node_id != self.config.node_id),
            reboot_triggered=self.reboot_triggered,
            rebooted_holding_lock=self.rebooted_holding_lock and bool(holds),
            breaker_open=breaker,
            breaker_detail=(
                f"{self.state.consecutive_reboots} reboots in a row did not clear the sentinel"
            ),
            next_window_at=None if window_open else self.window.next_open(now),
            held_off_until=(
                datetime.fromtimestamp(until, tz=UTC) if held_off and until is not None else None
            ),
            held_off_detail="the last reboot attempt did not clear the sentinel",
        )

    async def tick(self) -> Decision:
        """One observe → decide → act round. Never raises for expected failures."""
        self.view.last_tick_at = self._unix()
        await self._release_deleted_holders()
        for _ in range(3):  # an acquired lock is used in the same tick
            obs = await self.observe()
            decision = decide(obs)
            self._record(obs, decision)
            if decision.action is not Action.ACQUIRE or not await self._acquire():
                break
        if decision.why is Why.LOCK_HELD_ELSEWHERE:
            self._warn_held_elsewhere(obs.now)
        await self._prefer_no_schedule(decision)
        await self._act(decision)
        await self._maintenance_step()
        return decision

    def _warn_held_elsewhere(self, now: datetime) -> None:
        """One warning per holder per check (so once per ``--period``) while this node waits
        for a lock another node holds: how long it has held it and whether its record expires
        (field report B36, kured #137: "Lock already held" with no age nor way out). A holder
        that is up but NotReady keeps a TTL-0 record for ever, as in kured: the lock expires by
        each record's own TTL only (docs/kured.md "Lock TTL")."""
        for h in self.lock_view.holders:
            if h.node_id == self.config.node_id or h.expired(now):
                continue
            age = max(0.0, (now - h.created_at).total_seconds())
            if h.ttl_seconds > 0:
                left = h.ttl_seconds - age
                fate = f"its record expires in {left:.0f}s (TTL {h.ttl_seconds:g}s)"
            else:
                fate = (
                    "its record never expires (TTL 0): if that node is not coming back, delete "
                    "its lock entry or run with --release-lock-of-deleted-nodes"
                )
            log.warning(
                "waiting for the reboot lock: held by %s for %.0fs (since %s); %s",
                h.node_id,
                age,
                h.created_at.isoformat(),
                fate,
            )

    def _record(self, obs: Observation, decision: Decision) -> None:
        said = self.view.decision
        if said is None or (said.action, said.first) != (decision.action, decision.first):
            # Once per change, not every period: the log says why, without flooding.
            log.info("decision %s: %s", decision.action.value, decision.first or "reboot now")
        self.view.observation, self.view.decision = obs, decision
        key = decision.action.value
        self.view.decisions_total[key] = self.view.decisions_total.get(key, 0) + 1
        if self.state.breaker_open and obs.reboot_required is False:
            log.info("reboot no longer required: closing the circuit breaker")
            self.state.breaker_open = False
            self.state.consecutive_reboots = 0
            self.store.save(self.state)
        if self.state.held_off_until is not None and obs.reboot_required is False:
            self.state.held_off_until = None
            self.store.save(self.state)

    async def _acquire(self) -> bool:
        unschedulable = False
        if self.node is not None:
            # kured B3: remember whether the node is cordoned *before* we touch it.
            try:
                unschedulable = await self.node.unschedulable()
            except KuredError as exc:
                log.warning("cannot read the node before taking the lock: %s", exc.message)
                self.view.fail("node")
                return False
        try:
            ok = await self.lock.acquire(
                self.config.node_id,
                unschedulable=unschedulable,
                ttl_seconds=self.config.lock_ttl_seconds,
            )
        except LockError as exc:
            log.warning("cannot take the lock: %s", exc.message)
            self.view.fail("lock")
            return False
        if ok:
            log.info("lock acquired by %s", self.config.node_id)
        return ok  # the tick observes (and so re-reads the lock) right after

    async def _reread_lock(self) -> None:
        """Refresh the holders status and metrics show, right after a lock operation."""
        try:
            await self.lock_view.refresh()
        except LockError as exc:
            log.warning("cannot read the lock after changing it: %s", exc.message)

    async def _act(self, decision: Decision) -> None:
        if decision.action is Action.RELEASE:
            await self._release(after_reboot=self.rebooted_holding_lock)
        elif decision.action is Action.REBOOT:
            await self._reboot()

    async def _release(self, after_reboot: bool) -> None:
        """Give the lock back: restore the node first (Kubernetes backend), then sleep the
        release delay only after a reboot (not after a failed drain: kured #1129)."""
        if self.node is not None:
            uncordoned = await self._restore_node()
            if after_reboot:
                # Saved: an agent restarted while the maintenance waits for its gates still
                # knows whether the node was uncordoned (no hook, no "back" message if not).
                if self.state.back_uncordoned != uncordoned:
                    self.state.back_uncordoned = uncordoned
                    self.store.save(self.state)
                if uncordoned:
                    self._notify("uncordon")
        delay = self.config.lock_release_delay_seconds
        if after_reboot and delay > 0:
            back = self.state.came_back_at
            left = delay if back is None else max(0.0, delay - (self._unix() - back))
            log.info(
                "waiting %.1fs (--lock-release-delay %.0fs, counted from the return after the "
                "reboot) before releasing the lock",
                left,
                delay,
            )
            await self.sleep(left)
        try:
            await self.lock.release(self.config.node_id)
        except LockError as exc:
            log.warning("cannot release the lock: %s", exc.message)
            self.view.fail("lock")
            return
        self.rebooted_holding_lock = False
        self._recovery_done()
        log.info("lock released by %s", self.config.node_id)
        await self._reread_lock()
        if self.state.maintenance_since is not None and not self.state.maintenance_rebooted:
            await self._abandon_maintenance("the lock was given back before the reboot")

    def _recovery_done(self) -> None:
        if self.state.came_back_at is not None:
            self.state.came_back_at = None
            self.store.save(self.state)

    async def _reboot(self) -> None:
        if not await self._enter_maintenance():
            return
        if self.node is not None and not await self._prepare_node():
            return
        if self.config.reboot_delay_seconds > 0:
            log.info(
                "waiting %gs (--reboot-delay) before the reboot", self.config.reboot_delay_seconds
            )
            await self.sleep(self.config.reboot_delay_seconds)
        if self.notifier is not None:
            self.notifier.send("reboot")
            await self.notifier.flush()  # bounded: the message must leave before the machine
        if self.maintenance.silencer is not None:
            await self._refresh_silence_quietly()  # a full duration to cover the boot
        self.state.reboot_triggered_at = self._unix()
        self.state.boot_id = self.boot_id()
        self.store.save(self.state)
        log.warning("rebooting node %s", self.config.node_id)
        try:
            await self.rebooter.reboot()
        except RebootError as exc:
            log.error("reboot failed: %s", exc.message)
            self.view.fail("reboot")
            self.state.reboot_triggered_at = None
            # A failed reboot command is a reboot that did not clear the sentinel: it counts
            # towards the breaker and holds further attempts off (B40; kured #17, #44: a node
            # drained every period and never rebooted).
            self.state.consecutive_reboots += 1
            self._check_breaker()
            self._hold_off(f"the reboot command failed ({exc.message})")
            self.store.save(self.state)
            await self._release(after_reboot=False)  # do not sit on the lock
            return
        self.reboot_triggered = True

    # -- forever ---------------------------------------------------------------------------------

    async def run(self) -> None:
        """Recover, check at once, then at a uniformly random point in [½P, 1½P) (spreading
        the agents of a fleet, as kured's jittered ticker does), then every P. Expected
        failures never escape."""
        await self.recover()
        period = self.config.period_seconds
        self.view.next_check_at = self._unix()
        log.info(
            "node %s: first check now (%s), then about every %gs",
            self.config.node_id,
            datetime.fromtimestamp(self.view.next_check_at, tz=UTC).isoformat(),
            period,
        )
        try:
            await self._forever()
        finally:
            await self._stop_keeper()

    async def _forever(self) -> None:
        period = self.config.period_seconds
        delay = 0.0
        first = True
        while True:
            await self.sleep(delay)
            try:
                await self.tick()
            except KuredError as exc:
                log.error("tick failed: %s", exc.message)
                self.view.fail("tick")
            delay = self.rng.uniform(0.5, 1.5) * period if first else period
            spread = self.rng.uniform(0.0, min(period / 4, WINDOW_SPREAD_SECONDS))
            delay = until_window(self.window, self.now(), delay, spread)
            self.view.next_check_at = self._unix() + delay
            if first:
                log.info(
                    "next check at %s",
                    datetime.fromtimestamp(self.view.next_check_at, tz=UTC).isoformat(),
                )
            first = False


def until_window(window: Window, now: datetime, delay: float, spread: float = 0.0) -> float:
    """``delay`` (seconds to the next check), or less when ``window`` is closed at ``now`` and
    opens sooner: the agent checks ``spread`` seconds into the opening (or at it, when the
    opening is shorter), so a window shorter than ``--period`` is not slept through, and a
    fleet's agents do not all check at the same instant (the caller draws ``spread`` for each
    check, up to ``WINDOW_SPREAD_SECONDS``, as the period's own jitter spreads them). kured
    checks only on its ticks, and a 30-minute window with its 1-hour period was missed about
    half the time (a hostile tester's reading of the loop)."""
    if window.contains(now):
        return delay
    opens = window.next_open(now)
    if opens is None:
        return delay
    wait = max(0.0, (opens - now).total_seconds())
    if wait >= delay:
        return delay
    if spread > 0 and window.contains(now + timedelta(seconds=wait + spread)):
        wait += spread
    return min(delay, wait)
