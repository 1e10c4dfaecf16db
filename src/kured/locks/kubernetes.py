"""The reboot lock as kured keeps it: an annotation on kured's own DaemonSet.

The annotation ``--lock-annotation`` (default ``weave.works/kured-node-lock``) on DaemonSet
``--ds-namespace``/``--ds-name`` holds exactly what kured 1.23 writes there
(``kured.core.lockrecord``): the single format when ``max_holders`` (``--concurrency``) is 1,
``{"maxOwners":N,"locks":[…]}`` above. Records written by Go kured are honoured and ours parse
as kured's, so a fleet can move from kured to us, or back, in the middle of a rollout.

Every change is kured's cycle (kured-behaviour.md §2.5): GET the DaemonSet → apply the pure
transition to the parsed annotation → PUT the whole object *as read*, only the annotation
changed, carrying the ``resourceVersion`` that was read. The API server refuses a PUT on a
stale ``resourceVersion`` with 409; mutual exclusion rests on that alone, never on timing, and
never on a blind PATCH that could overwrite another node's record. A 409 (another node won the
race, or an unrelated write such as a Helm sync) is retried from the GET after a jittered,
growing pause (kured sleeps a flat second); after ``max_attempts`` conflicts in a row the call
raises ``LockConflict``. A PUT whose answer was lost (a timeout) may have landed; the retry
re-reads and the transition sees the change already made.

Differences from kured, on purpose: kured retries the DaemonSet GET every 5 s for up to 5 min
inside the lock; here one read failure is a ``LockError`` at once and the agent's next tick is
the retry (the lock is then "unknown", which blocks a reboot and is shown). The transitions'
own differences (pruning expired entries, no duplicate entries, format recognised from the
stored JSON) are documented in ``kured.core.lockrecord``.

Instances are safe to use from many tasks of one event loop; ``close()`` closes the
``ApiServer`` only if this lock created it.
"""

from __future__ import annotations

import copy
import random
from typing import Any

from kit.backoff import Backoff
from kit.clock import Clock
from kured.apiserver import ApiServer, JsonObject
from kured.core import lockrecord
from kured.core.errors import ApiError, LockConflict, LockError
from kured.core.lockrecord import LockRecord, Outcome, Transition, Write
from kured.locks.record import RecordLock

DEFAULT_MAX_ATTEMPTS = 16
# Conflict backoff: full jitter over a cap that doubles from the base up to kured's flat 1 s.
BACKOFF_BASE_SECONDS = 0.02
BACKOFF_CAP_SECONDS = 1.0


def conflict_backoff(rng: random.Random) -> Backoff:
    """The pause policy between a 409 and the re-read (full jitter, ``kit.backoff``); one per
    call, shared by the annotation and the Lease lock."""
    return Backoff(BACKOFF_BASE_SECONDS, BACKOFF_CAP_SECONDS, rng=rng)


class ApiObjectLock(RecordLock):
    """The part the annotation lock and the Lease lock (``kured.locks.lease``) share: their
    arguments, ``close()``, and the cycle GET → transition → write carrying the
    ``resourceVersion`` read, retried from the GET after each 409 with ``conflict_backoff``
    and ended by ``LockConflict`` after ``max_attempts`` conflicts in a row. A subclass
    supplies ``_read`` (the object as read, None when absent, and its record), ``_write`` and
    ``where``; ``_kind`` names the object in the ``LockConflict`` message.

    ``clock`` stamps ``created`` and judges expiry (kured uses the reading node's clock).
    ``max_attempts`` bounds the GET+write rounds of one call; ``rng`` draws the conflict
    pauses. One instance may serve several node ids; concurrent calls are safe, the API
    server's ``resourceVersion`` check orders them.
    """

    _kind = "object"

    def __init__(
        self,
        api: ApiServer,
        namespace: str,
        name: str,
        annotation: str,
        max_holders: int,
        clock: Clock,
        *,
        owns_api: bool = False,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        rng: random.Random | None = None,
    ) -> None:
        super().__init__(max_holders, clock, max_attempts)
        self._api = api
        self._owns_api = owns_api
        self._namespace = namespace
        self._name = name
        self._annotation = annotation
        self._rng = rng or random.Random()
        self.conflicts_total = 0  # 409s seen (stale writes and lost creates), for tests and logs

    @property
    def where(self) -> str:
        raise NotImplementedError

    async def close(self) -> None:
        if self._owns_api:
            await self._api.close()

    async def _read_record(self) -> LockRecord | None:
        _, record = await self._read()
        return record

    async def _read(self) -> tuple[JsonObject | None, LockRecord | None]:
        raise NotImplementedError

    async def _write(self, obj: JsonObject | None, outcome: Outcome) -> None:
        """Store ``outcome`` over ``obj`` as read (None: absent). Raises ``ApiError``."""
        raise NotImplementedError

    async def _change(self, transition: Transition) -> Outcome:
        backoff = conflict_backoff(self._rng)
        for _ in range(self._max_attempts):
            obj, record = await self._read()
            outcome = transition(record)
            if outcome.write is Write.KEEP or (obj is None and outcome.write is Write.DELETE):
                return outcome
            try:
                await self._write(obj, outcome)
            except ApiError as exc:
                if not exc.conflict:
                    raise LockError(f"cannot write the lock: {exc.message}") from exc
                self.conflicts_total += 1
                await backoff.sleep()
                continue
            return outcome
        raise LockConflict(
            f"{self.where}: the {self._kind} changed under {self._max_attempts} writes in a row "
            "(409)"
        )


class KubernetesLock(ApiObjectLock):
    """The ``Lock`` protocol on annotation ``annotation`` of DaemonSet ``namespace/name``,
    admitting ``max_holders`` nodes. Arguments and concurrency as ``ApiObjectLock``."""

    _kind = "DaemonSet"

    @property
    def where(self) -> str:
        return f"daemonset {self._namespace}/{self._name} annotation {self._annotation}"

    # -- read, transition, PUT -------------------------------------------------------------------

    async def _read(self) -> tuple[JsonObject, LockRecord | None]:
        try:
            obj = await self._api.get_daemonset(self._namespace, self._name)
        except ApiError as exc:
            if exc.not_found:
                raise LockError(
                    f"daemonset {self._namespace}/{self._name} not found: the lock lives in "
                    "its annotation (check --ds-namespace and --ds-name)"
                ) from exc
            raise LockError(f"cannot read the lock: {exc.message}") from exc
        annotations = (obj.get("metadata") or {}).get("annotations") or {}
        value = annotations.get(self._annotation)
        if value is None:
            return obj, None
        if not isinstance(value, str):
            raise LockError(f"{self.where} is not a string")
        return obj, lockrecord.parse(value)

    def _updated(self, obj: JsonObject, outcome: Outcome) -> JsonObject:
        """``obj`` as read with only the annotation changed (resourceVersion kept)."""
        body = copy.deepcopy(obj)
        metadata: dict[str, Any] = body.setdefault("metadata", {})
        annotations = metadata.get("annotations")
        if not isinstance(annotations, dict):
            annotations = metadata["annotations"] = {}
        if outcome.write is Write.DELETE:
            annotations.pop(self._annotation, None)
        else:
            assert outcome.record is not None
            annotations[self._annotation] = lockrecord.serialise(outcome.record).decode()
        return body

    async def _write(self, obj: JsonObject | None, outcome: Outcome) -> None:
        assert obj is not None  # _read raises when the DaemonSet is absent
        await self._api.replace_daemonset(self._namespace, self._name, self._updated(obj, outcome))
