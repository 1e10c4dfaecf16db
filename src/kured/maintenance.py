"""The maintenance around a planned reboot, as steps of the agent (``kured.loop``): the
Alertmanager silence (kured #499), the pre-drain and post-uncordon hooks (#501) and the "node is
back" message (#585).

The order, once the lock is taken and the decision is to reboot:

1. **Enter** (before the pre-reboot labels, the cordon and the drain): the state file records
   the maintenance (``AgentState.maintenance_since``), then the silence is created
   (``kured.actuators.silence``), then the pre-drain hook runs (``kured.actuators.hooks``). If
   Alertmanager cannot be reached or refuses, or the hook fails, the reboot is blocked like a
   gate would block it, but loudly: the lock is given back at once (nothing on the node was
   touched yet), the silence (if any) is expired, the decision says why
   (``silence_failed`` / ``pre_drain_hook_failed``, shown by ``kured status``), the failure is
   counted (``kured_failures_total{kind="silence"|"hook"}``) and the next check tries again.
   An unreachable Alertmanager blocks rather than letting the reboot go on unsilenced: the
   operator asked that this node's alerts be silenced while it is out.
2. **Keep**: while the maintenance lasts the silence is extended to ``now +
   --alertmanager-silence-duration`` every third of that duration and right before the reboot
   command; so a silence outlives the boot, and the silence of an agent that never comes back
   ends by itself at most one duration after its last extension.
3. **Back** (at each check once the machine rebooted within the maintenance and the lock is
   given back after the uncordon): the gates are checked again (the window and the sentinel do
   not matter now). While one blocks, the silence is kept and extended and ``kured status``
   says what the maintenance waits for. Once all pass: the post-uncordon hook runs and the
   "back" message goes out (``--message-template-back`` to the ``--notify-url``s, after the
   messages still in flight), both only when the node was uncordoned (a node cordoned by an
   operator before the lock stays cordoned and gets neither, like the uncordon message), then
   the silence is expired. A failed expiry is retried at the next check. The "back" message is
   off unless ``--message-template-back`` is given (kured sends three messages; existing
   manifests keep getting three).
4. **Abandon**: whenever the lock is given back before the machine rebooted (a failed drain, a
   failed reboot command, a decision to release) the silence is expired at once; and at start a
   maintenance whose reboot did not happen (the agent was killed, or restarted, before the
   reboot) is abandoned. At start the silences of this node that kured made are found in
   Alertmanager by their ``createdBy``/``comment`` (not only by an id in the state file), so one
   created by an agent killed before it wrote its state is expired too. A failed expiry is
   retried at every check until it succeeds.

``MaintenanceSteps`` is a base class of ``Agent`` (next to ``kured.choreography.NodeSteps``):
it declares the agent attributes it uses.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from kured.actuators.hooks import Hook, HookError, document
from kured.actuators.silence import SilenceError, Silencer, ends_at
from kured.contract import AgentConfig, AgentView, Gate, Notify, Sleep
from kured.core.errors import LockError
from kured.core.policy import Action, Decision, Reason, Why
from kured.locks.base import Lock
from kured.state import AgentState, StateStore

log = logging.getLogger(__name__)


@dataclass
class MaintenanceKit:
    """What the maintenance uses: the silencer (``--alertmanager-url``), the silence duration,
    the two hooks. All optional: without them the maintenance still tracks the reboot for the
    "back" message."""

    silencer: Silencer | None = None
    silence_duration_seconds: float = 1800.0
    pre_drain: Hook | None = None
    post_uncordon: Hook | None = None


class MaintenanceSteps:
    """The maintenance steps of ``Agent`` (see the module docstring)."""

    config: AgentConfig
    lock: Lock
    view: AgentView
    sleep: Sleep
    notifier: Notify | None
    gates: Sequence[Gate]
    state: AgentState
    store: StateStore
    maintenance: MaintenanceKit
    rebooted_holding_lock: bool
    reboot_triggered: bool
    silence_sweep_pending: bool
    _keeper: asyncio.Task[None] | None

    def now(self) -> datetime:
        raise NotImplementedError  # the agent's

    def _unix(self) -> float:
        raise NotImplementedError  # the agent's

    async def _reread_lock(self) -> None:
        raise NotImplementedError  # the agent's

    # -- enter -----------------------------------------------------------------------------------

    async def _enter_maintenance(self) -> bool:
        """Record, silence, pre-drain hook. False when the reboot is blocked (lock given back)."""
        st = self.state
        if st.maintenance_since is None or st.maintenance_rebooted:
            st.maintenance_since = self._unix()
            st.maintenance_rebooted = False
            st.back_announced = False
            st.back_uncordoned = True
            self.store.save(st)
        self.view.maintenance.phase = "entering: silence, pre-drain hook"
        if self.maintenance.silencer is not None:
            try:
                await self._refresh_silence()
            except SilenceError as exc:
                await self._block(
                    Why.SILENCE_FAILED,
                    "silence",
                    f"cannot silence this node's alerts before the drain: {exc.message}; "
                    "reboot blocked, lock released, next attempt at the next check",
                )
                return False
            self._start_keeper()
        hook = self.maintenance.pre_drain
        if hook is not None:
            try:
                await hook.run(self._document("pre-drain"))
            except HookError as exc:
                self.view.maintenance.hook_ran("pre-drain", "failed")
                self.view.maintenance.last_hook_failure = (self._unix(), exc.message)
                await self._block(
                    Why.PRE_DRAIN_HOOK_FAILED,
                    "hook",
                    f"pre-drain hook failed: {exc.message}; reboot blocked, lock released, "
                    "next attempt at the next check",
                )
                return False
            self.view.maintenance.hook_ran("pre-drain", "ok")
            log.info("pre-drain hook done (%s)", hook.describe())
        self.view.maintenance.phase = "draining and rebooting"
        return True

    def _document(self, event: str) -> dict[str, str]:
        node = self.config.node_id
        return document(node, event, self.now(), node)

    async def _block(self, why: Why, kind: str, text: str) -> None:
        """The reboot is blocked before anything touched the node: expire the silence, give
        the lock back at once, and make the reason the decision."""
        log.error("%s", text)
        self.view.fail(kind)
        self.view.decision = Decision(Action.RELEASE, (Reason(why, text),))  # shown at once
        await self._abandon_maintenance("the reboot was blocked")
        try:
            await self.lock.release(self.config.node_id)
        except LockError as exc:
            log.warning("cannot release the lock: %s", exc.message)
            self.view.fail("lock")
        else:
            log.info("lock released by %s", self.config.node_id)
        await self._reread_lock()

    # -- keep ------------------------------------------------------------------------------------

    async def _refresh_silence(self) -> None:
        """Create the silence or extend it to now + the duration; raises ``SilenceError``."""
        silencer = self.maintenance.silencer
        if silencer is None:
            return
        now = self.now()
        since = self.state.maintenance_since or self._unix()
        until = ends_at(now, self.maintenance.silence_duration_seconds)
        silence_id = await silencer.ensure(now, until, datetime.fromtimestamp(since, tz=UTC))
        m = self.view.maintenance
        if silence_id != m.silence_id:
            log.info(
                "alertmanager silence %s for node %s (%s) until %s",
                silence_id,
                self.config.node_id,
                ", ".join(str(x) for x in silencer.matchers),
                until.isoformat(),
            )
        m.silence_id, m.silence_ends_at = silence_id, until.timestamp()
        self.silence_sweep_pending = False

    async def _refresh_silence_quietly(self) -> None:
        """Extend the silence; a failure is logged and counted (the silence still runs). Any
        failure: an unexpected one (a bug) must not stop the keeper or the agent either."""
        try:
            await self._refresh_silence()
        except SilenceError as exc:
            log.warning("cannot extend the alertmanager silence: %s", exc.message)
            self.view.fail("silence")
        except Exception:
            log.exception("cannot extend the alertmanager silence (unexpected error)")
            self.view.fail("silence")

    def _start_keeper(self) -> None:
        if self.maintenance.silencer is not None and (self._keeper is None or self._keeper.done()):
            self._keeper = asyncio.get_running_loop().create_task(
                self._keep_silence(), name="silence-keeper"
            )
            self._keeper.add_done_callback(self._keeper_ended)

    def _keeper_ended(self, task: asyncio.Task[None]) -> None:
        """The keeper ends only when cancelled; anything else is logged and counted, and
        ``_maintenance_step`` starts it again at the next check."""
        if not task.cancelled() and task.exception() is not None:
            log.error("the silence keeper stopped", exc_info=task.exception())
            self.view.fail("silence")

    async def _keep_silence(self) -> None:
        while True:
            await self.sleep(self.maintenance.silence_duration_seconds / 3)
            await self._refresh_silence_quietly()

    async def _stop_keeper(self) -> None:
        task, self._keeper = self._keeper, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # -- abandon ---------------------------------------------------------------------------------

    async def _abandon_maintenance(self, why: str) -> None:
        """Expire this node's silences and forget the maintenance (its reboot did not happen)."""
        st = self.state
        if st.maintenance_since is not None:
            log.warning("maintenance abandoned (%s): expiring the silence", why)
        await self._stop_keeper()
        await self._expire_silences(why)
        if (
            st.maintenance_since is not None
            or st.maintenance_rebooted
            or st.back_announced
            or not st.back_uncordoned
        ):
            st.maintenance_since, st.maintenance_rebooted, st.back_announced = None, False, False
            st.back_uncordoned = True
            self.store.save(st)
        self.view.maintenance.phase = ""

    async def _expire_silences(self, why: str) -> bool:
        """Expire every silence of this node's that kured made; False (and retried at the next
        check) when Alertmanager could not be asked."""
        silencer = self.maintenance.silencer
        if silencer is None:
            return True
        try:
            expired = await silencer.expire_ours()
        except SilenceError as exc:
            log.error("cannot expire this node's alertmanager silence: %s", exc.message)
            self.view.fail("silence")
            self.silence_sweep_pending = True
            return False
        if expired:
            log.info("alertmanager silence %s expired (%s)", ", ".join(expired), why)
        self.silence_sweep_pending = False
        self.view.maintenance.silence_id = ""
        self.view.maintenance.silence_ends_at = None
        return True

    async def _recover_maintenance(self) -> None:
        """At start: carry on a maintenance whose reboot happened; abandon any other (which
        also expires a silence of ours that no state recorded)."""
        st = self.state
        if st.maintenance_since is not None and (
            self.rebooted_holding_lock or st.maintenance_rebooted
        ):
            if not st.maintenance_rebooted:
                st.maintenance_rebooted = True
                self.store.save(st)
            log.info(
                "back from the reboot: the maintenance lasts until the node is uncordoned and "
                "its gates pass"
            )
            self.view.maintenance.phase = "back from the reboot: uncordon, then the gates"
            await self._refresh_silence_quietly()
            self._start_keeper()
            return
        await self._abandon_maintenance("restarted with no reboot in progress")

    # -- back ------------------------------------------------------------------------------------

    async def _maintenance_step(self) -> None:
        """At each check: retry a failed expiry; end the maintenance once the node is back."""
        st = self.state
        if st.maintenance_since is None:
            if self.silence_sweep_pending:
                await self._expire_silences("no maintenance in progress")
            return
        if not st.maintenance_rebooted or self.rebooted_holding_lock or self.reboot_triggered:
            return
        self._start_keeper()  # again, if it stopped (it should not)
        results = await asyncio.gather(*(g.check() for g in self.gates))
        waiting = [r for r in results if r.blocking is not False]
        m = self.view.maintenance
        if waiting:
            text = "node back; waiting for its gates to end the maintenance: " + "; ".join(
                ("unknown: " if r.blocking is None else "") + (r.detail or r.name) for r in waiting
            )
            if text != m.phase:
                log.info("%s", text)
            m.phase = text
            return
        if not st.back_announced:
            await self._announce_back()
            st.back_announced = True
            self.store.save(st)
        await self._stop_keeper()
        if not await self._expire_silences("the node is back and its gates pass"):
            self._start_keeper()  # keep it alive until the expiry succeeds
            return
        st.maintenance_since, st.maintenance_rebooted, st.back_announced = None, False, False
        st.back_uncordoned = True
        self.store.save(st)
        m.phase = ""
        log.info("maintenance of node %s done", self.config.node_id)

    async def _announce_back(self) -> None:
        """The post-uncordon hook, then the "back" message (after the messages in flight)."""
        if not self.state.back_uncordoned:
            log.info(
                "node %s stays cordoned (it was before the lock): no post-uncordon hook, no "
                "back message",
                self.config.node_id,
            )
            return
        if self.notifier is not None:
            await self.notifier.flush()  # bounded: the uncordon message goes first
        hook = self.maintenance.post_uncordon
        if hook is not None:
            try:
                await hook.run(self._document("post-uncordon"))
            except HookError as exc:
                log.error("post-uncordon hook failed (not retried): %s", exc.message)
                self.view.fail("hook")
                self.view.maintenance.hook_ran("post-uncordon", "failed")
                self.view.maintenance.last_hook_failure = (self._unix(), exc.message)
            else:
                self.view.maintenance.hook_ran("post-uncordon", "ok")
                log.info("post-uncordon hook done (%s)", hook.describe())
        if self.notifier is not None and self.notifier.sends("back"):
            self.notifier.send("back")
        log.info("node %s is back: uncordoned and its gates pass", self.config.node_id)
