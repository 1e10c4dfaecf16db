"""The node choreography of the Kubernetes backend, as steps of the agent (``kured.loop``):
pre-reboot labels, ``--drain-delay``, the drain notification, cordon and drain before the reboot;
restoring the node (uncordon retried until it succeeds, post labels, the in-progress annotation)
before every release; the orphaned-cordon check; the ``--prefer-no-schedule-taint`` taint; and
the ``--release-lock-of-deleted-nodes`` check (``kured.actuators.deleted_nodes``) before each
tick.

The agent (with a ``NodeActuator``, ``node``) follows kured's node choreography
(docs/reference/kured-behaviour.md §2.2-2.4):

* before taking the lock it reads whether the node is already cordoned, and the lock record
  keeps that (``unschedulable``);
* before the reboot: pre-reboot labels → cordon → drain. If the cordon or drain fails and
  ``--force-reboot`` is off, the node is uncordoned (when the record says it was schedulable)
  and the lock is released **at once**, without ``--lock-release-delay`` - kured sleeps the
  delay first and so keeps a healthy node cordoned for it (#1129). The failure is the tick's
  decision (``drain_failed``), counted (``kured_failures_total{kind="drain"}``) and kept in
  ``kured status`` as the last drain failure. The next eligible tick tries again;
* whenever it gives the lock back (after the reboot, after a failure, or because it is now
  blocked) it first restores the node: uncordon only if the record says the node was
  schedulable when the lock was taken and the cordon carries our mark (a node an operator
  cordoned, before the lock or after it, stays cordoned: field report B41), then the
  post-reboot labels, and after a reboot the in-progress annotation once the sentinel is gone.
  A failed uncordon is retried with jittered exponential backoff (``uncordon_backoff_*``) and
  the lock is kept until it succeeds: releasing it with the node still cordoned would let the
  next node cordon while this one is still out of service (issue 15). The tick's decision
  says so meanwhile (``uncordon_failed``). The release delay is slept only after a reboot;
* on start, and on later ticks until it succeeds, a cordon marked as ours on a node that holds
  no lock (an orphan: a lock force-released by an operator, an uncordon that failed) is undone;
* with ``--annotate-nodes`` the two kured annotations are written before the gates run.

``NodeSteps`` is a base class of ``Agent``: it declares the agent attributes it uses, and
``_release`` is the agent's.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable

from kit.backoff import Backoff
from kured.contract import (
    AgentConfig,
    AgentView,
    DeletedHolderCheck,
    DrainFailure,
    NodeActuator,
    Notify,
    Sleep,
)
from kured.core.errors import DrainError, KuredError, LockError
from kured.core.policy import Action, Decision, Reason, Why
from kured.locks.base import Holder, Lock

log = logging.getLogger(__name__)


class NodeSteps:
    """The node steps of ``Agent`` (see the module docstring). Not safe for concurrent use:
    one agent task drives them."""

    config: AgentConfig
    node: NodeActuator | None
    lock: Lock
    view: AgentView
    rng: random.Random
    sleep: Sleep
    orphan_check_pending: bool
    tainted: bool | None
    notifier: Notify | None
    deleted_holders: DeletedHolderCheck | None

    async def _release(self, after_reboot: bool) -> None:
        raise NotImplementedError  # the agent's

    async def _reread_lock(self) -> None:
        raise NotImplementedError  # the agent's

    def _unix(self) -> float:
        raise NotImplementedError  # the agent's: its clock, in unix seconds

    async def _release_deleted_holders(self) -> None:
        """``--release-lock-of-deleted-nodes``: before observing, so a freed slot is seen."""
        if self.deleted_holders is None:
            return
        try:
            holders = await self.lock.holders()
        except LockError:
            return  # observe() reads again, logs and counts it
        if await self.deleted_holders.check(h.node_id for h in holders):
            await self._reread_lock()

    def _notify(self, event: str) -> None:
        """Start the ``--notify-url`` message for ``event``; never blocks, never raises."""
        if self.notifier is not None:
            self.notifier.send(event)

    async def _prefer_no_schedule(self, decision: Decision) -> None:
        """kured's ``--prefer-no-schedule-taint``: on while waiting for the lock (the acquire
        failed), off once no reboot is pending; unchanged otherwise."""
        if decision.action is Action.ACQUIRE:
            want = True
        elif decision.why in (Why.NOT_REQUIRED, Why.OUTSIDE_WINDOW, Why.REBOOTED):
            want = False
        else:
            return
        if self.node is None or self.tainted is want:
            return
        try:
            await self.node.prefer_no_schedule(want)
        except KuredError as exc:
            log.warning(
                "cannot %s the PreferNoSchedule taint: %s", "add" if want else "remove", exc.message
            )
            self.view.fail("node")
            return
        self.tainted = want

    async def _restore_node(self) -> bool:
        """Uncordon per the lock record (retried until it succeeds: see the module docstring),
        post labels, and once the sentinel is gone the in-progress annotation. Label and
        annotation failures are logged and counted; they do not hold the lock. False when the
        node was left cordoned on purpose: the record says it was cordoned before the lock, or
        the cordon carries no mark of ours (someone cordoned it after the lock was taken and
        before our cordon: field report B41)."""
        assert self.node is not None
        me = self.config.node_id
        own: Holder | None = None
        try:
            own = next((h for h in await self.lock.holders() if h.node_id == me), None)
        except LockError as exc:
            log.warning("cannot read the lock record before releasing: %s", exc.message)
        uncordoned = True
        if own is None:
            # No record to go by: undo the cordon only if it carries our mark.
            await self._until_uncordoned(self.node.undo_orphaned_cordon)
        elif own.unschedulable:
            log.info("node %s was cordoned before the lock was taken: leaving it cordoned", me)
            uncordoned = False
        else:
            # The record says schedulable; a cordon without our mark was set since (B41).
            uncordoned = await self._until_uncordoned(self.node.undo_own_cordon)
        try:
            await self.node.apply_labels("post")
        except KuredError as exc:
            log.warning("cannot apply the post-reboot labels: %s", exc.message)
            self.view.fail("node")
        # kured removes it in phase A only; any release with the sentinel gone means the
        # reboot happened (also when kured itself triggered it before a rollout to us).
        obs = self.view.observation
        if obs is not None and obs.reboot_required is False:
            try:
                await self.node.clear_reboot_in_progress()
            except KuredError as exc:
                log.warning("cannot remove the reboot-in-progress annotation: %s", exc.message)
                self.view.fail("node")
        return uncordoned

    async def _until_uncordoned(self, uncordon: Callable[[], Awaitable[bool]]) -> bool:
        """Run ``uncordon`` until it succeeds, pausing with equal jitter (``kit.backoff``:
        from half a doubling ceiling to it) between attempts; every failure is logged, counted
        and shown as the decision. Returns what the successful call returned."""
        backoff = Backoff(
            self.config.uncordon_backoff_initial_seconds,
            self.config.uncordon_backoff_cap_seconds,
            jitter=0.5,
            rng=self.rng,
        )
        while True:
            try:
                done = await uncordon()
            except KuredError as exc:
                wait = backoff.failed()
                attempt = backoff.failures
                text = (
                    f"cannot uncordon node {self.config.node_id} (attempt {attempt}): "
                    f"{exc.message}; keeping the lock, retrying in {wait:.1f}s"
                )
                log.error("%s", text)
                self.view.fail("uncordon")
                self.view.decision = Decision(Action.RELEASE, (Reason(Why.UNCORDON_FAILED, text),))
                await self.sleep(wait)
                continue
            if attempt := backoff.failures:
                log.info(
                    "uncordoned node %s after %d failed attempts", self.config.node_id, attempt
                )
                self.view.decision = Decision(
                    Action.RELEASE,
                    (Reason(Why.UNCORDON_FAILED, f"uncordoned after {attempt} failed attempts"),),
                )
            return done

    async def _check_orphaned_cordon(self, holds: bool | None) -> None:
        if self.node is None or not self.orphan_check_pending or holds is not False:
            return
        try:
            await self.node.undo_orphaned_cordon()
        except KuredError as exc:
            log.warning("cannot check the node for an orphaned cordon: %s", exc.message)
            self.view.fail("node")
            return
        self.orphan_check_pending = False

    async def _prepare_node(self) -> bool:
        """Pre-reboot labels → cordon → drain. True to go on with the reboot; False when the
        drain failed and the attempt was given up (node restored, lock released at once)."""
        assert self.node is not None
        try:
            await self.node.apply_labels("pre")
        except KuredError as exc:
            log.warning("cannot apply the pre-reboot labels: %s", exc.message)  # kured: logged
            self.view.fail("node")
        if self.config.drain_delay_seconds > 0:
            log.info(
                "waiting %gs (--drain-delay) before the drain", self.config.drain_delay_seconds
            )
            await self.sleep(self.config.drain_delay_seconds)
        self._notify("drain")
        try:
            await self.node.cordon()
            await self.node.drain()
        except DrainError as exc:
            self.view.fail("drain")
            if self.config.force_reboot:
                log.error("drain failed: %s; rebooting anyway (--force-reboot)", exc.message)
                self.view.last_drain_failure = DrainFailure(
                    self._unix(), exc.message, exc.pods, "rebooting anyway"
                )
                return True
            log.error(
                "drain failed: %s; giving this attempt up: restoring the node and releasing "
                "the lock now",
                exc.message,
            )
            self.view.last_drain_failure = DrainFailure(
                self._unix(), exc.message, exc.pods, "released"
            )
            await self._release(after_reboot=False)
            self.view.decision = Decision(
                Action.RELEASE,
                (
                    Reason(
                        Why.DRAIN_FAILED,
                        f"drain failed: {exc.message}; lock released, node restored, "
                        "next attempt at the next tick",
                    ),
                ),
            )
            return False
        return True
