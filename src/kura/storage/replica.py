"""Copies from peers, applied by ``CacheService``: one artifact streamed (``apply_replica``), or
many small ones stored inline in one transaction (``apply_small_replicas``, bootstrap batches),
each at the peer's version by last-writer-wins (``core.version``).

Every copy passes the skew gate (``_admit``) before anything is read, is staged and verified
like a local write, and is never re-enqueued in the outbox: every node ships its own writes to
all. A bootstrap copy is stamped as last used at the eviction floor.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import AsyncIterator, Sequence

from kura.core.errors import (
    DigestMismatch,
    InsufficientStorage,
    InvalidRequest,
    KuraError,
    PayloadTooLarge,
)
from kura.core.manifest import Manifest
from kura.core.version import ApplyOutcome, decide_apply
from kura.storage.batch_write import BatchWrite
from kura.storage.blobs import stage_body
from kura.storage.budget import Reservation
from kura.storage.fsync import fsync_path
from kura.storage.state import decide as _decide
from kura.storage.state import subject as _subject
from kura.storage.verify import problem_with_bytes


class ReplicaApply(BatchWrite):
    """Copies from peers (module docstring)."""

    # -- copies from peers -------------------------------------------------------------------

    async def replica_outcome(self, manifest: Manifest, source: str) -> ApplyOutcome:
        """What ``apply_replica`` would do with ``manifest`` now, from the checks it makes
        before reading a byte: the inline limit (``PayloadTooLarge``), the skew gate
        (``FutureVersion``), last-writer-wins and tombstones. A copy served before it is
        stored (``mesh.read_through``) must pass them first."""
        if manifest.inline and manifest.size > self.max_inline_bytes:
            raise PayloadTooLarge(
                f"an inline artifact of {manifest.size} bytes exceeds the inline limit of "
                f"{self.max_inline_bytes} bytes (KURA_MAX_KEYVALUE_BYTES, KURA_INLINE_MAX_BYTES)",
                self.max_inline_bytes,
            )
        return await self.apply_outcome_for(manifest, source)

    async def apply_outcome_for(
        self, manifest: Manifest, source: str | None = None
    ) -> ApplyOutcome:
        """What applying ``manifest`` would do now (a pre-check before fetching its body).
        With ``source``, a version too far ahead raises ``FutureVersion`` first (``_admit``)."""
        if source is not None:
            self._admit(manifest.version_ms, source, _subject(manifest))
        return await self._in(self._reader, self._precheck_sync, manifest)

    def _precheck_sync(self, manifest: Manifest) -> ApplyOutcome:
        index = self._require_index()
        existing = index.get(manifest.artifact_id)
        return _decide(index, manifest, None if existing is None else existing[0])

    async def apply_replica(
        self,
        manifest: Manifest,
        body: AsyncIterator[bytes],
        *,
        declared_length: int | None,
        source: str,
        reservation: Reservation | None = None,
        background: bool = False,
        via: str = "",
    ) -> ApplyOutcome:
        """Apply a peer's copy of an artifact at the peer's version (last writer wins).
        ``via`` names the peer it came from (recorded with the row; ``source`` when empty).

        The body must be exactly ``manifest.size`` bytes hashing to ``manifest.sha256``
        (``DigestMismatch``/``IncompleteBody``/``InvalidRequest`` otherwise); a copy that is not
        newer than what is stored, or is covered by a tombstone, is ignored without staging it.
        Staging uses ``reservation`` when given (bootstrap reserves and waits itself), else a
        fail-fast ``try_reserve`` (``ResourceExhausted`` when the tmp budget is full).
        A version more than ``max_clock_skew_ms`` ahead raises ``FutureVersion`` (400) before
        anything is read. Never enqueues outbox messages. Safe to call concurrently.

        The body is written and hashed on the low-priority background threads
        (``storage.offload``) when nobody waits on it: a bootstrap's, or ``background`` (a
        read-through copy already served from memory). Otherwise on the event loop.

        While start-up's reconciliation runs it waits first (``_writes_open``: refused at once,
        ``Unavailable`` 503, when the estimate is past ``KURA_STARTUP_WAIT_SECONDS``), before a
        byte of ``body`` is read or staged: the peers' internal listener writes to the store
        without ``storage.startup_gate``, and a body staged only to be refused at the commit
        would be sent again from the peer's outbox.
        """
        await self._writes_open()
        outcome = await self.replica_outcome(manifest, source)
        if outcome is not ApplyOutcome.APPLIED:
            self._count(source, outcome.value)
            return outcome
        if manifest.size > self.max_disk_bytes:
            raise InsufficientStorage(
                f"artifact of {manifest.size} bytes exceeds the node's disk budget "
                f"({self.max_disk_bytes} bytes)"
            )
        if declared_length is not None and declared_length != manifest.size:
            raise InvalidRequest(
                f"Content-Length {declared_length} does not match the manifest size {manifest.size}"
            )
        self._check_free_disk(manifest.size)
        if manifest.inline:
            data = b"".join([chunk async for chunk in _capped(body, manifest.size)])
            if len(data) != manifest.size or hashlib.sha256(data).hexdigest() != manifest.sha256:
                raise DigestMismatch("inline body does not match its manifest")
            return (await self._commit(manifest, None, data, source=source, via=via)).outcome
        own = reservation is None
        held = self.budget.try_reserve(max(1, manifest.size)) if own else reservation
        assert held is not None
        try:
            try:
                staged = await stage_body(
                    body,
                    self.files.new_staging_path(
                        "bootstrap" if source == "bootstrap" else "uploads"
                    ),
                    held,
                    limit_bytes=min(held.size_bytes, manifest.size),
                    declared_length=manifest.size,
                    expected_sha256=manifest.sha256,
                    offload=self._background if background or source == "bootstrap" else None,
                )
            except PayloadTooLarge:
                raise InvalidRequest(
                    f"body exceeded its manifest size and reserved "
                    f"{min(held.size_bytes, manifest.size)} bytes; rejected"
                ) from None
            try:
                await self._in(self._syncer, fsync_path, staged.path)
                result = await self._commit(
                    manifest,
                    staged.path,
                    None,
                    source=source,
                    xxh3_128=staged.xxh3_128,
                    via=via,
                )
                return result.outcome
            finally:
                staged.path.unlink(missing_ok=True)
        finally:
            if own:
                held.release()

    # -- many small copies at once (bootstrap batches) --------------------------------------

    async def apply_outcomes_for(self, manifests: Sequence[Manifest]) -> list[ApplyOutcome]:
        """``apply_outcome_for`` (without the skew gate) for many manifests in one reader-thread
        call: what applying each would do now."""
        return await self._in(self._reader, self._precheck_many_sync, list(manifests))

    def _precheck_many_sync(self, manifests: list[Manifest]) -> list[ApplyOutcome]:
        index = self._require_index()
        stored = index.versions([m.artifact_id for m in manifests])
        # The tombstone, or the purge of the writer when newer, per (namespace, writer).
        covers: dict[tuple[str, str], int | None] = {}
        outcomes = []
        for m in manifests:
            scope = (m.namespace_id, m.writer)
            if scope not in covers:
                covers[scope] = index.covered(*scope)
            version, sha = stored.get(m.artifact_id, (None, ""))
            outcomes.append(decide_apply(m.version_ms, version, covers[scope], m.sha256, sha))
        return outcomes

    async def apply_small_replicas(
        self, items: Sequence[tuple[Manifest, bytes]], *, source: str, via: str = ""
    ) -> list[ApplyOutcome | KuraError]:
        """Apply many peers' copies of small artifacts, each at the peer's version (last writer
        wins), stored inline in the index in ONE transaction: one durable commit for the batch
        instead of a file, a directory and a WAL fsync per artifact. For each item, in order:
        its outcome, or the error that refused it (``DigestMismatch`` for bytes that do not
        match the manifest, ``PayloadTooLarge`` above ``max_inline_bytes``, ``FutureVersion``
        past the skew limit). Raises ``ResourceExhausted``/``Unavailable`` (nothing applied)
        when the disk cannot take the batch. Never enqueues outbox messages."""
        results: list[ApplyOutcome | KuraError] = []
        accepted: list[tuple[int, Manifest, bytes]] = []
        for i, (manifest, data) in enumerate(items):
            try:
                if manifest.size > self.max_inline_bytes:
                    raise PayloadTooLarge(
                        f"{manifest.size} bytes is above the inline limit", self.max_inline_bytes
                    )
                self._admit(manifest.version_ms, source, _subject(manifest))
                if problem_with_bytes(data, manifest) is not None:
                    raise DigestMismatch("body does not match its manifest")
            except KuraError as exc:
                results.append(exc)
                continue
            results.append(ApplyOutcome.APPLIED)  # replaced below by the writer's verdict
            accepted.append((i, dataclasses.replace(manifest, inline=True), data))
        if not accepted:
            return results
        self._check_free_disk(sum(m.size for _i, m, _d in accepted))
        await self._writes_open()  # start-up's reconciliation must not race the publish
        outcomes = await self._in(
            self._writer,
            self._commit_many_sync,
            accepted,
            self._take_touches(),
            source,
            via or source,
        )
        for (i, _m, _d), outcome in zip(accepted, outcomes, strict=True):
            results[i] = outcome
        return results

    def _commit_many_sync(
        self,
        items: list[tuple[int, Manifest, bytes]],
        touches: dict[str, int],
        source: str,
        via: str,
    ) -> list[ApplyOutcome]:
        """Writer thread: the version rule for each item, eviction for the whole batch, then
        every applied row in one transaction; replaced files are unlinked after the commit."""
        index = self._require_index()
        if touches:
            index.touch(touches)
        self._evict_sync(sum(m.size for _i, m, _d in items), "")
        outcomes: list[ApplyOutcome] = []
        rows: list[tuple[Manifest, bytes | None, str | None, str | None]] = []
        replaced: list[Manifest | None] = []
        for _i, manifest, data in items:
            existing = index.get(manifest.artifact_id)
            stored = None if existing is None else existing[0]
            outcome = _decide(index, manifest, stored)
            self._count(source, outcome.value)
            outcomes.append(outcome)
            if outcome is ApplyOutcome.APPLIED:
                rows.append((manifest, data, None, None))
                replaced.append(stored)
        if not rows:
            return outcomes
        floor = self._eviction_floor_ms()  # a bootstrap copy counts as used when it began
        stamp_ms = floor if source == "bootstrap" and floor is not None else self.clock.now_ms()
        index.upsert_many(rows, stamp_ms, via=via)
        ids = [m.artifact_id for m, _d, _s, _x in rows]
        self.hot.invalidate(ids, replaced=any(old is not None for old in replaced))
        for (manifest, _d, _s, _x), old in zip(rows, replaced, strict=True):
            if old is not None and not old.inline:
                self._writer.unlink_later(self.files.blob_path(old))
            self.stats.used_bytes += manifest.size - (0 if old is None else old.size)
            if old is None:
                self.stats.artifacts += 1
        return outcomes


async def _capped(body: AsyncIterator[bytes], limit_bytes: int) -> AsyncIterator[bytes]:
    size = 0
    async for chunk in body:
        size += len(chunk)
        if size > limit_bytes:
            raise InvalidRequest(f"body is longer than the manifest size {limit_bytes}")
        yield chunk
