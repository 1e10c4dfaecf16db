"""Heal the bucket's copy of an artifact that a client sends again (issue 26 item 10).

A PUT that finds the artifact stored and intact here stores nothing, so nothing was uploaded
and a damaged object in the bucket stayed for good. Now such a PUT (``sent_again``) queues a
check of the bucket's copy (``repair_copy``: read whole, hashed against its own header); a copy
damaged, missing or not kura's is replaced by this node's verified one. A copy that is whole is
left alone whatever its version (last writer wins). Each artifact is checked at most once per
``CHECK_AGAIN_SECONDS``; at most ``CHECK_QUEUE_MAX`` wait (more are dropped: the client's next
PUT asks again). A check that failed (store down, breaker open) is not remembered as done.
Cost: one GET of the object per check.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging

from kit.clock import Clock
from kura.core.errors import NotFound
from kura.core.object_layout import object_key
from kura.storage.object_store import CircuitOpen, NotKuraObject, ObjectStore
from kura.storage.service import CacheService

log = logging.getLogger(__name__)

CHECK_QUEUE_MAX = 1024
CHECK_AGAIN_SECONDS = 600.0
CHECKED_REMEMBERED = 8192


class BucketHeal:
    """See module docstring. ``ObjectTier`` creates one and runs ``run()`` in its TaskGroup."""

    def __init__(self, service: CacheService, store: ObjectStore, clock: Clock) -> None:
        self.service = service
        self.store = store
        self.clock = clock
        self._to_check: dict[str, None] = {}  # artifact ids, in arrival order
        self._checked_at: dict[str, float] = {}  # artifact id -> monotonic s, oldest first
        self._check_wake = asyncio.Event()

    def sent_again(self, artifact_id: str) -> None:
        """A client sent ``artifact_id`` again and it is intact here: queue a check of the
        bucket's copy (module docstring), unless it was checked in the last
        ``CHECK_AGAIN_SECONDS`` or ``CHECK_QUEUE_MAX`` checks wait already. Never blocks."""
        if artifact_id in self._to_check or len(self._to_check) >= CHECK_QUEUE_MAX:
            return
        checked = self._checked_at.get(artifact_id)
        if checked is not None and self.clock.monotonic() - checked < CHECK_AGAIN_SECONDS:
            return
        self._to_check[artifact_id] = None
        self._check_wake.set()

    async def run(self) -> None:
        """Forever: check the queued copies one at a time, in arrival order."""
        while True:
            await self._check_wake.wait()
            self._check_wake.clear()
            while self._to_check:
                aid = next(iter(self._to_check))
                del self._to_check[aid]
                try:
                    await self.repair_copy(aid)
                except CircuitOpen:
                    continue  # the breaker logged the outage; the client's next PUT asks again
                except Exception as exc:  # one check failing must not stop the others
                    log.warning("object store: checking the copy of %s failed: %s", aid, exc)
                    continue  # not checked: the next PUT of it asks again
                self._checked_at.pop(aid, None)
                self._checked_at[aid] = self.clock.monotonic()
                if len(self._checked_at) > CHECKED_REMEMBERED:
                    del self._checked_at[next(iter(self._checked_at))]

    async def repair_copy(self, artifact_id: str) -> bool:
        """Read the bucket's copy of ``artifact_id`` whole and hash it against its own header;
        when it is damaged, missing or not a kura object, upload this node's copy (verified:
        ``read_by_id(hashed=True)``). True when it was replaced; False when it was whole, or
        this node no longer holds the artifact. Raises ObjectStoreError (nothing changed)."""
        try:
            body = await self.service.reads.read_by_id(artifact_id, hashed=True)
        except NotFound:
            return False
        try:
            manifest = body.manifest
            key = object_key(self.service.tenant_id, manifest.namespace_id, artifact_id)
            problem = await self._copy_problem(key)
            if problem is None:
                return False
            log.warning(
                "object store copy of %s %s; uploading this node's verified copy",
                artifact_id,
                problem,
            )
            source = body.data if body.data is not None else body.file
            assert source is not None
            await self.store.put_file(key, manifest, source)
            return True
        finally:
            body.close()

    async def _copy_problem(self, key: str) -> str | None:
        """What is wrong with the object at ``key``, None when it is whole (its bytes match the
        size and SHA-256 its own header declares)."""
        try:
            got = await self.store.get(key)
        except NotKuraObject:
            return "is not a kura object"
        if got is None:
            return "is missing"
        manifest, chunks = got
        digest, size = hashlib.sha256(), 0
        try:
            async for chunk in chunks:
                await asyncio.to_thread(digest.update, chunk)  # off the loop: objects are large
                size += len(chunk)
        finally:
            await chunks.aclose()  # type: ignore[attr-defined]
        if size != manifest.size or digest.hexdigest() != manifest.sha256:
            return (
                f"is damaged ({size} bytes with SHA-256 {digest.hexdigest()[:16]}..., its header "
                f"declares {manifest.size} bytes with {manifest.sha256[:16]}...)"
            )
        return None
