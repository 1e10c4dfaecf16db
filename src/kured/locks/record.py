"""``RecordLock``: the ``Lock`` protocol over any store holding one kured lock record.

A backend supplies two things: ``_read_record`` (the current record, or None) and ``_change``
(read the record, apply a ``lockrecord`` transition, write it back with the store's
compare-and-swap, retry a lost compare). Everything else — validation, kured's acquire and
release rules, holders and holding — is the same for etcd and the Kubernetes annotation, and
lives here once.
"""

from __future__ import annotations

from functools import partial

from kit.clock import Clock
from kured.core import lockrecord
from kured.core.lockrecord import LockRecord, Outcome, Transition
from kured.locks.base import Attempt, Holder


class RecordLock:
    """Base of ``EtcdLock`` and ``KubernetesLock``. Subclasses implement the two store calls."""

    def __init__(self, max_holders: int, clock: Clock, max_attempts: int) -> None:
        if max_holders < 1:
            raise ValueError("max_holders must be at least 1")
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self._max_holders = max_holders
        self._clock = clock
        self._max_attempts = max_attempts

    @property
    def max_holders(self) -> int:
        return self._max_holders

    def _now_ns(self) -> int:
        return self._clock.now_ms() * 1_000_000

    async def _read_record(self) -> LockRecord | None:
        raise NotImplementedError

    async def _change(self, transition: Transition) -> Outcome:
        raise NotImplementedError

    async def attempt(self, node_id: str, unschedulable: bool, ttl_seconds: float) -> Attempt:
        """Like ``acquire``, also returning the holders the answer was decided on.

        ``unschedulable`` is whether the node was cordoned before it took the lock (kured's
        ``metadata.unschedulable``); ``ttl_seconds`` ≥ 0 (0: never expires), stored as integer
        nanoseconds. An unexpired entry of ``node_id`` is kept as is (no refresh). Raises
        ``LockError`` (store unreachable, record not kured's JSON: it is left as it was) or
        ``LockConflict`` after too many lost compares.
        """
        if not node_id:
            raise ValueError("node_id must not be empty")
        if ttl_seconds < 0:
            raise ValueError("ttl_seconds must not be negative")
        ttl_ns = round(ttl_seconds * 1_000_000_000)

        def transition(record: LockRecord | None) -> Outcome:
            return lockrecord.acquire(
                record,
                node_id,
                unschedulable=unschedulable,
                ttl_ns=ttl_ns,
                now_ns=self._now_ns(),
                max_holders=self._max_holders,
            )

        outcome = await self._change(transition)
        return Attempt(outcome.held, [Holder.from_entry(e) for e in outcome.entries])

    async def acquire(self, node_id: str, unschedulable: bool, ttl_seconds: float) -> bool:
        """Take a slot for ``node_id``; True if it holds one now (see ``attempt``)."""
        return (await self.attempt(node_id, unschedulable, ttl_seconds)).acquired

    async def release(self, node_id: str) -> None:
        """Remove ``node_id``'s entries; a no-op if it has none. The last entry of a
        single-holder lock removes the record; a multi-holder lock keeps
        ``{"maxOwners":N,"locks":[]}`` (both as kured). No release delay here: that is the
        agent's. Raises ``LockError``/``LockConflict`` like ``attempt``."""
        await self._change(
            partial(lockrecord.release, node_id=node_id, max_holders=self._max_holders)
        )

    async def holders(self) -> list[Holder]:
        """Every stored entry, expired ones included, in record order. Raises ``LockError``."""
        record = await self._read_record()
        entries = record.entries if record is not None else ()
        return [Holder.from_entry(entry) for entry in entries]

    async def holding(self, node_id: str) -> bool:
        """kured's Holding: ``node_id`` has an unexpired entry. Raises ``LockError``."""
        return lockrecord.holding(await self._read_record(), node_id, self._now_ns())
