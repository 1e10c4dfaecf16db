"""The object-storage tier: the durable outbox uploader, fills on a local miss, cleans.

The rules (docs/object-storage.md states them for operators):

* **Durability.** A local write is acknowledged once it is durable on local disk AND its upload
  is queued in the node's durable outbox, in the same SQLite transaction (the existing outbox,
  with ``OUTBOX_TARGET`` as one more target, the only one of an artifact write: nodes sharing
  the bucket copy no bodies; ``CacheService``'s ``bucket``).
  ``run`` drains that queue in order: an upsert uploads the artifact as stored now, a
  namespace clean deletes the namespace's objects; a message is deleted only after the store answered 2xx. Failures (store
  down, timeouts, 5xx, 503 SlowDown, refused credentials) are logged, counted by result in
  ``ObjectStoreStats`` and retried with the shared jittered exponential backoff (``kit.backoff``); nothing is dropped. An
  artifact whose upload is pending is never evicted (``MetadataIndex.least_recently_used``),
  so an outage never loses an acknowledged write and local reads keep being served.
* **A full disk never stops the queue** (issue 26 item 5). With the store down, writes over
  ``KURA_MAX_DISK_BYTES`` stay (they cannot be evicted) until the disk reaches
  ``KURA_MIN_FREE_DISK_BYTES`` and writes answer 503. The queue keeps delivering all along
  (``OutboxLog.outbox_batch`` ignores free space), and each delivery recorded evicts back to
  the budget (``outbox_ack``), so once the store answers the node frees its disk and takes
  writes again by itself. While the store fails and the disk is full, ``warnings`` (``/ready``)
  says why writes are refused, and one ERROR line says so when it starts.
* **A damaged copy is replaced when a client sends the artifact again** (issue 26 item 10):
  ``sent_again`` queues a check of the bucket's copy (``storage.bucket_heal``).
* **A failing store is skipped** (issue 26 item 6): the client's circuit breaker
  (``storage.breaker``) refuses requests at once after failures in a row, so a local miss
  does not wait ``KURA_OBJECT_STORE_TIMEOUT``; ``warnings`` names the store as unreachable.
* **Last writer wins in the bucket too.** Before uploading, the stored object's header is read
  (a ranged GET); an object at the same or a newer version is left alone, unless its version
  lies more than ``KURA_MAX_CLOCK_SKEW_MS`` ahead of this node's clock: no node may issue
  such a version (a peer's is refused, ``CacheService._admit``), and no node could fill it
  either, so a local write replaces it (issue 26 item 10) and a clean deletes it. S3 has no
  compare-and-swap on our versions, so two nodes uploading the same key at the same moment may
  leave the older one (until it is written again); build-cache keys name their content, so
  the two bodies are normally the same.
* **Fills.** A local miss (``fill``: the tier is the ``storage.fill.FillSource`` of the reader
  ``kura.app`` composes, asked before any peer) reads the object, and stores it through
  ``CacheService.apply_replica`` at the writer's version: the object's size reserved in the tmp
  budget before a byte is written, streamed to staging, verified against the manifest's SHA-256,
  committed without any outbox message (a fill never replicates). The local namespace tombstone
  still rules: an object older than a clean this node knows is not served.
* **Cleans.** A clean's outbox message lists the namespace's prefix and deletes each object
  last modified at or before the tombstone's version; a later one is deleted only if its own
  header says its version is at or below the tombstone (a newer write by another node stays).
  A purge of one writer's entries (``CacheService.purge_writer``) lists the same prefix and
  reads each object's header: those of that writer at or below the purge's version are
  deleted (one ranged GET per object of the namespace: a purge is an operator's rare act;
  an object without kura's header is nobody's and stays). They are deleted as bucket expiry
  deletes, in batches paced by ``KURA_EXPIRY_MAX_DELETES_PER_SECOND``, each victim's header
  read again just before, so another writer's newer upload of the key since the listing is
  kept. A fill of an older copy of that writer is then ignored by the version rule, as under
  a clean. Every node that applies a purge, a peer's too, sends it to the bucket
  (``purge_writer``): an upload queued on a peer before the purge reached it lands after the
  first bucket purge, and its own purge, queued behind that upload, deletes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from kit.backoff import Backoff, every
from kit.clock import Clock
from kit.pace import Pace
from kura.core.errors import KuraError, NotFound, Unavailable
from kura.core.manifest import Manifest
from kura.core.object_layout import OUTBOX_TARGET, namespace_prefix, object_key
from kura.core.version import ApplyOutcome, ahead_of_skew_ms
from kura.storage.bucket_expiry import paced_deletes, rechecked
from kura.storage.bucket_heal import BucketHeal
from kura.storage.fill import Filled
from kura.storage.object_store import CircuitOpen, ObjectStore, ObjectStoreError
from kura.storage.outbox import DELETE_NAMESPACE, PURGE_WRITER, UPSERT, OutboxMessage
from kura.storage.ports import OutboxLog
from kura.storage.service import CacheService

log = logging.getLogger(__name__)

BATCH = 32
PIPELINE = 4
BACKOFF_START_SECONDS = 0.5
IDLE_POLL_SECONDS = 2.0


class ObjectTier:
    """See module docstring. Create after the service, ``await check_start()`` before serving,
    run ``run()`` in the app's TaskGroup."""

    def __init__(
        self,
        service: CacheService,
        store: ObjectStore,
        clock: Clock,
        backoff_max_seconds: float = 30.0,
        *,
        max_deletes_per_second: int = 200,
        delete_batch_size: int = 100,
    ) -> None:
        self.service = service
        # A purge's deletions, paced as bucket expiry's (KURA_EXPIRY_MAX_DELETES_PER_SECOND)
        self.max_deletes_per_second = max_deletes_per_second
        self.delete_batch_size = min(delete_batch_size, max_deletes_per_second)
        self._outbox: OutboxLog = service.replica_log  # its queue of uploads (OUTBOX_TARGET)
        self.store = store
        self.clock = clock
        # The shared jittered backoff (kit.backoff), equal jitter as the shipper's.
        self._backoff = Backoff(BACKOFF_START_SECONDS, backoff_max_seconds, jitter=0.5)
        self._wake = asyncio.Event()
        self._written = 0  # local writes acknowledged (``wake``), for the queue's gauge
        self._failing = False  # the last pass left messages undelivered
        self.heal = BucketHeal(service, store, clock)  # checks of copies sent again
        self._stalled = False  # failing with the disk full: writes refused until it drains

    # -- wiring ------------------------------------------------------------------------------

    def wake(self) -> None:
        """A local write or clean was committed with its upload queued (with a bucket, every one
        is): the queue's gauge reads at least 1 at once, before the write is answered, so that
        nobody who saw the write acknowledged sees the queue empty before it is sent. The exact
        count follows at the uploader's next pass."""
        self._written += 1
        stats = self.store.stats
        stats.upload_queue_depth = max(1, stats.upload_queue_depth)
        self._wake.set()

    async def check_start(self) -> None:
        """Raise ``StartError`` when the bucket is missing or the credentials are refused; log
        a WARNING and carry on when the store cannot be reached now (the outbox holds writes)."""
        failure = await self.store.check()
        result = None if failure is None else failure.result
        if result in ("bucket_missing", "auth"):
            cfg = self.store.config
            what = (
                f"bucket {cfg.bucket!r} does not exist"
                if result == "bucket_missing"
                else f"the credentials (AWS_ACCESS_KEY_ID={cfg.access_key_id or '(unset)'}) "
                "were refused"
            )
            raise StartError(
                f"object store {self.store.describe()}: {what}; fix KURA_OBJECT_STORE_URL or the "
                "AWS_* variables (see docs/object-storage.md)"
            )
        if result is not None:
            log.warning(
                "object store %s not usable at start (%s); writes queue in the outbox and upload "
                "when it answers",
                self.store.describe(),
                failure,
            )

    # -- fills -------------------------------------------------------------------------------

    async def fill(self, artifact_id: str, namespace_id: str) -> Filled | None:
        """On a local miss: fetch the artifact from the bucket into the local tier. ``Filled``
        when it is stored locally now, None when not (absent, refused, or a clean covers it).
        Store errors, and a bucket object that is not the artifact asked for, are logged and
        read as a miss. While start-up's background work runs (``storage.startup_work``: local
        writes wait for it, and the tombstones a fill is checked against may not be read yet)
        a bucket object raises ``Unavailable`` (503 with ``Retry-After``, the start-up
        estimate) before a byte of its body is read: never a miss for what the bucket has, and
        never a body the node cannot yet check against a clean or purge."""
        key = object_key(self.service.tenant_id, namespace_id, artifact_id)
        try:
            got = await self.store.get(key)
        except CircuitOpen:  # the breaker logged the outage once; a miss per line would flood
            return None
        except ObjectStoreError as exc:
            log.warning("object store fill of %s failed: %s", artifact_id, exc.message)
            return None
        if got is None:
            return None
        manifest, chunks = got
        try:
            if self.service.artifact_id_of(manifest) != artifact_id:
                raise ObjectStoreError("error", f"object {key} holds another artifact")
            if not self.service.startup.done:
                raise self._held_for_startup(manifest)
            outcome = await self.service.apply_replica(
                manifest, chunks, declared_length=manifest.size, source="object_store"
            )
        except ObjectStoreError as exc:  # an Unavailable too: caught first, a damaged object
            log.warning("object store fill of %s failed: %s", artifact_id, exc.message)
            return None
        except KuraError as exc:
            if isinstance(exc, Unavailable) and not self.service.startup.done:
                raise  # start-up's work: the bucket has it, a 503 says so (never a miss)
            log.warning("object store fill of %s refused: %s", artifact_id, exc.message)
            return None
        except (OSError, ValueError) as exc:  # a local staging problem: a miss, never a 500
            log.warning("object store fill of %s failed locally: %s", artifact_id, exc)
            return None
        finally:
            with contextlib.suppress(Exception):
                await chunks.aclose()  # type: ignore[attr-defined]
        if outcome is ApplyOutcome.APPLIED:
            self.store.stats.filled_bytes_total += manifest.size
            return Filled()
        # Ignored: the same or a newer version is here already, or a clean covers it.
        present = await self.service.reads.read_manifest(artifact_id)
        return None if present is None else Filled()

    def _held_for_startup(self, manifest: Manifest) -> Unavailable:
        """The 503 for a bucket object found while start-up's work runs: start-up's reason and
        ``Retry-After`` (``StartupWork.unavailable``), naming the object store."""
        refusal = self.service.startup.unavailable()
        return Unavailable(
            f"{refusal.message}; {manifest.size} bytes are in the object store, filled once it "
            "is done",
            retry_after_seconds=refusal.retry_after_seconds,
        )

    # -- the uploader ------------------------------------------------------------------------

    async def run(self) -> None:
        """Forever: drain the bucket's outbox queue in order, backing off after a failure;
        and probe the store while its circuit breaker is open (``probe_store``)."""
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self.probe_store(), name="object store probe")
            tasks.create_task(self.heal.run(), name="object store copy checks")
            await self._upload_forever()

    def sent_again(self, artifact_id: str) -> None:
        """A client sent ``artifact_id`` again and it is intact here: queue a check of the
        bucket's copy (``BucketHeal.sent_again``). Never blocks."""
        self.heal.sent_again(artifact_id)

    async def probe_store(self) -> None:
        """Forever: while the store's circuit breaker is open, send its probe once each
        cool-down is over (``ObjectStore.probe``), so that no client's miss is the one that
        waits for a hung store. Polls a few times per cool-down (at most every second)."""
        breaker = self.store.breaker
        poll_seconds = min(1.0, max(0.05, breaker.cooldown_seconds / 4))

        async def probe_if_due() -> None:
            if breaker.probe_due():
                await self.store.probe()

        await every(probe_if_due, poll_seconds, what="object store probe", log=log)

    async def _upload_forever(self) -> None:
        while True:
            self._wake.clear()
            try:
                batch = await self._outbox.outbox_batch(OUTBOX_TARGET, BATCH)
                await self._refresh_gauges()
                if not batch:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(IDLE_POLL_SECONDS):
                            await self._wake.wait()
                    continue
                done = await self._deliver(batch)
                acked = await self._outbox.outbox_ack(done)
                complete = len(done) == len(batch) and acked == len(done)
            except Exception:  # an index or local-file problem: keep the queue, try again later
                log.exception("object store upload queue: a pass failed; retrying with backoff")
                complete = False
            self._note_progress(complete)
            if complete:
                self._backoff.reset()
            else:
                await self._backoff.sleep()

    def _note_progress(self, complete: bool) -> None:
        """Log the start and the end of a stall (the store failing while the disk is full):
        once each, not once per pass."""
        self._failing = not complete
        stalled = self._failing and self._disk_full()
        if stalled and not self._stalled:
            log.error(
                "object store upload queue stalled: %d uploads pending and the store fails "
                "while the disk is full (KURA_MIN_FREE_DISK_BYTES=%d): writes answer 503 until "
                "the store takes the uploads, which makes their artifacts evictable",
                self.store.stats.upload_queue_depth,
                self.service.min_free_disk_bytes,
            )
        elif self._stalled and not stalled:
            log.info("object store upload queue moving again")
        self._stalled = self.store.stats.upload_stalled = stalled

    def warnings(self) -> list[str]:
        """The tier's problems for ``/ready`` warnings: the store unreachable (its circuit
        breaker open), the upload queue stalled with the disk full. Empty when all is well."""
        found = []
        state = self.store.breaker.state
        if state.open:
            found.append(
                f"object store {self.store.describe()} unreachable: {state.consecutive_failures} "
                f"failures in a row ({state.last_failure}); local misses do not wait for it, "
                "uploads queue in the outbox"
            )
        if self._failing and self.store.stats.upload_queue_depth:
            full = self._disk_full()
            found.append(
                f"object store upload queue not draining: {self.store.stats.upload_queue_depth} "
                f"messages, oldest {self.store.stats.upload_oldest_age_seconds:.0f}s"
                + (
                    "; the disk is full and their artifacts cannot be evicted until uploaded: "
                    "writes are refused (503) until the store takes them"
                    if full
                    else ""
                )
            )
        return found

    async def _refresh_gauges(self) -> None:
        written = self._written
        depths = await self._outbox.outbox_depths()
        count, oldest_ms = depths.get(OUTBOX_TARGET, (0, 0))
        if self._written != written:  # a write was acknowledged while the count was read
            count = max(1, count)
        stats = self.store.stats
        stats.upload_queue_depth = count
        now = self.clock.now_ms()
        age = max(0.0, (now - oldest_ms) / 1000)  # the enqueue time is wall-clock time
        stats.upload_oldest_age_seconds = age if count and oldest_ms else 0.0

    async def _deliver(self, batch: list[OutboxMessage]) -> list[int]:
        """Deliver ``batch`` in order; the ids of the leading messages delivered (a failure
        stops there, so the queue keeps its order). A run of upserts goes up to ``PIPELINE`` at
        once, each artifact once (an upload sends its current version); a clean waits for
        everything before it, and everything after it waits for the clean."""
        done: list[int] = []
        sem = asyncio.Semaphore(PIPELINE)

        async def upload(artifact_id: str) -> bool:
            async with sem:
                return await self._send(UPSERT, artifact_id, "", 0, "")

        i = 0
        while i < len(batch):
            if batch[i].kind != UPSERT:
                msg = batch[i]
                if not await self._send(msg.kind, "", msg.namespace_id, msg.version_ms, msg.writer):
                    return done
                done.append(msg.id)
                i += 1
                continue
            j = i
            while j < len(batch) and batch[j].kind == UPSERT:
                j += 1
            aids = list(dict.fromkeys(m.artifact_id for m in batch[i:j]))
            results = await asyncio.gather(*(upload(a) for a in aids))
            uploaded = {a for a, good in zip(aids, results, strict=True) if good}
            for msg in batch[i:j]:
                if msg.artifact_id not in uploaded:
                    return done
                done.append(msg.id)
            i = j
        return done

    async def _send(
        self, kind: str, artifact_id: str, namespace_id: str, version_ms: int, writer: str
    ) -> bool:
        try:
            if kind == UPSERT:
                await self._upload(artifact_id)
            elif kind == DELETE_NAMESPACE:
                await self._delete_namespace(namespace_id, version_ms)
            elif kind == PURGE_WRITER:
                await self._purge_writer(namespace_id, writer, version_ms)
            return True
        except (ObjectStoreError, OSError) as exc:  # OSError: the local file went away mid-read
            log.warning(
                "object store upload queue: %s %s failed (retrying with backoff): %s",
                {UPSERT: "upload of", DELETE_NAMESPACE: "clean of namespace"}.get(
                    kind, "purge of a writer in namespace"
                ),
                artifact_id or repr(namespace_id),
                exc.message if isinstance(exc, ObjectStoreError) else exc,
            )
            return False

    async def _upload(self, artifact_id: str) -> None:
        """Upload the artifact as stored now (gone: nothing to do; a clean or a newer write
        covers it)."""
        try:
            body = await self.service.reads.read_by_id(artifact_id, hashed=True)
        except NotFound:
            return
        try:
            manifest = body.manifest
            key = object_key(self.service.tenant_id, manifest.namespace_id, artifact_id)
            stored = await self.store.stored_version_ms(key)
            if (
                stored is not None
                and stored >= manifest.version_ms
                and not self._beyond_skew(stored)
            ):
                return  # the same or a newer version is there (another node's, or a retry)
            source = body.data if body.data is not None else body.file
            assert source is not None
            await self.store.put_file(key, manifest, source)
        finally:
            body.close()

    async def _delete_namespace(self, namespace_id: str, version_ms: int) -> None:
        prefix = namespace_prefix(self.service.tenant_id, namespace_id)
        victims = []
        async for page in self.store.list_prefix(prefix):
            for obj in page:
                if obj.last_modified.timestamp() * 1000 <= version_ms:
                    victims.append(obj.key)
                    continue
                stored = await self.store.stored_version_ms(obj.key)
                if stored is not None and (stored <= version_ms or self._beyond_skew(stored)):
                    victims.append(obj.key)
        await self.store.delete_many(victims)
        if victims:
            log.info("object store: cleaned namespace %r (%d objects)", namespace_id, len(victims))

    async def _purge_writer(self, namespace_id: str, writer: str, version_ms: int) -> None:
        """Delete ``writer``'s objects of ``namespace_id`` at or below ``version_ms`` (each
        object's header says whose it is; an object without kura's header is nobody's). Paced
        and re-checked as bucket expiry deletes (``bucket_expiry.paced_deletes``): an object
        another writer replaced since the listing is kept."""
        prefix = namespace_prefix(self.service.tenant_id, namespace_id)

        async def still(key: str) -> str | None:
            header = await self.store.stored_header(key)
            doomed = header is not None and header[1] == writer and header[0] <= version_ms
            return key if doomed else None

        victims = []
        async for page in self.store.list_prefix(prefix):
            victims += await rechecked([obj.key for obj in page], still)
        pace = Pace(self.max_deletes_per_second, self.clock.monotonic)
        deleted = 0
        batches = paced_deletes(
            self.store,
            victims,
            lambda batch: rechecked(batch, still),
            lambda key: (key,),
            pace,
            self.delete_batch_size,
        )
        async for batch in batches:
            deleted += len(batch)
        log.info(
            "object store: purged writer %r in namespace %r (%d objects; %d more were written "
            "again or deleted since the listing)",
            writer,
            namespace_id,
            deleted,
            len(victims) - deleted,
        )

    def _disk_full(self) -> bool:
        """Writes are refused for want of disk space (at or near the free-space floor)."""
        service = self.service
        floor = service.min_free_disk_bytes
        return service.refusing_for_space or service.free_disk_bytes() <= floor

    def _beyond_skew(self, version_ms: int) -> bool:
        """Whether a bucket object's version is further ahead of this node's clock than
        ``KURA_MAX_CLOCK_SKEW_MS``: the bound a peer's version is refused beyond
        (``CacheService._admit``). Such an object cannot be filled anywhere, so it must not
        win against a local write either."""
        now = self.clock.now_ms()
        return ahead_of_skew_ms(version_ms, now, self.service.max_clock_skew_ms) > 0


class StartError(KuraError):
    """The object store is misconfigured (bucket missing, credentials refused): do not start."""
