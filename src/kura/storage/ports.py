"""The ports of storage: the narrow interfaces the layers above it (``kura.api``, ``kura.grpc``,
``kura.workers``, ``kura.mesh``) depend on instead of a concrete store.

Each is a ``typing.Protocol`` of at most ten members (``tests/unit/test_ports.py`` counts
them), satisfied structurally:

* ``ArtifactReader``: look-ups and verified reads. Implemented by the read path
  (``storage.reads.ArtifactReads``), which the primary's store (``CacheService.reads``) and a
  worker's read-only reader (``WorkerReads.reads``) each compose over their own index; one
  contract suite runs over both (``tests/integration/test_reader_contract.py``). A reader answers a miss as a miss (``read``
  raises ``NotFound``, ``exists`` is False, ``read_manifest`` None): whether someone else may
  have it (a peer, the primary) is decided above storage, by read-through or by the worker
  app's routing (``kura.workers.worker``).
* ``ArtifactWriter``: new local versions and namespace cleans (the primary's store only).
* ``PeerPages``: what the internal (peer) routes serve and apply: pages of manifests and
  tombstones, a peer's copy of an artifact, and the node's ``ChangeLog``.
* ``OutboxLog`` (with ``PeerQueueView``): what the shipper, catch-up and the object tier do with
  replication's outbox: each peer's queue (batches, acknowledgements, depths) and catch-up mark
  (forget, re-offer tombstones, clear).
* ``ChangeLog``: what the change-feed pull, anti-entropy and the internal routes read and
  record: this node's change feed, the cursors into peers' feeds and the range digests.

  Both are implemented by one object, ``storage.replica_log.IndexReplicaLog``
  (``CacheService.replica_log``), over the same index; each consumer types against the one
  it uses (none uses both). Storage never lends a SQLite connection.
* ``ReplicaSink``: where peers' copies and tombstones land when this node pulls them (the
  bootstrap, its small-body batches, anti-entropy): what applying each would do, applying
  them, the disk budget they are fetched within (the primary's store only).
* ``Provenance``: who wrote what in a namespace (issue 29 item 4): each writer's usage and a
  writer's entries (the primary's store; the purge itself is ``ArtifactWriter.purge_writer``).
* ``WorkerSupport``: what the primary does with its workers' reports (their hits for the LRU,
  entries that failed a check there, checksums computed there) and shares with them.

A consumer that needs two of them takes both (``api.http.ApiContext``, ``mesh.anti_entropy``);
the primary passes its store for each, and the store's ``reads`` for the reader.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Protocol

from kura.core.errors import KuraError
from kura.core.manifest import Manifest
from kura.core.version import ApplyOutcome
from kura.storage.artifact import (
    ArtifactRef,
    BatchBlob,
    Purge,
    PutResult,
    StoredBody,
    WriterUsage,
)
from kura.storage.budget import Reservation, TmpBudget
from kura.storage.hotcache import HotCache
from kura.storage.outbox import CatchUpMark, ChangesPage, OutboxMessage, PeerCursor, RangeDigests
from kura.storage.stats import StorageStats
from kura.storage.verify import ReadVerifier


class ArtifactReader(Protocol):
    """Look-ups and verified reads of stored artifacts. A damaged entry reads as a miss."""

    @property
    def verifier(self) -> ReadVerifier:
        """Hashes large bodies while they are sent (``api.file_response``)."""
        ...

    def artifact_id(self, ref: ArtifactRef) -> str:
        """``ref``'s identity on this node's tenant (``core.keys.artifact_id``)."""
        ...

    async def exists(self, ref: ArtifactRef) -> bool:
        """Whether a version of ``ref`` is stored (an index look-up; no body read)."""
        ...

    async def missing(
        self, refs: Sequence[ArtifactRef], sizes: Sequence[int] | None = None
    ) -> list[ArtifactRef]:
        """The refs with no stored version (or, with ``sizes``, none of that size in bytes)."""
        ...

    async def read(self, ref: ArtifactRef) -> StoredBody:
        """The artifact, verified or to be hashed while sent; ``NotFound`` on a miss."""
        ...

    async def read_manifest(self, aid: str) -> Manifest | None:
        """The stored manifest of artifact id ``aid``, or None."""
        ...

    async def read_by_id(self, aid: str, *, hashed: bool = False) -> StoredBody:
        """``read`` by artifact id (``hashed``: a large body hashed first); ``NotFound``."""
        ...

    async def read_many(
        self, aids: Sequence[str], *, as_reads: bool = False
    ) -> list[StoredBody | None]:
        """``read_by_id`` for many ids in one index look-up, None for each absent or damaged
        one (``as_reads``: through the hot cache, noted as uses; never filled)."""
        ...

    async def report_corrupt(self, manifest: Manifest, detected_by: str) -> bool:
        """A sender found ``manifest``'s bytes damaged; True if the entry now reads as a miss."""
        ...

    def record_xxh3_128(self, found: Sequence[tuple[Manifest, str]]) -> None:
        """Checksums (XXH3-128 hex) computed while verifying rows that had none; best effort."""
        ...


class ArtifactWriter(Protocol):
    """New local versions of artifacts and namespace cleans. Each raises (leaving nothing
    behind) what ``storage.write_path`` documents: PayloadTooLarge, InsufficientStorage,
    ResourceExhausted, IncompleteBody, DigestMismatch, InvalidRequest, Unavailable."""

    @property
    def budget(self) -> TmpBudget:
        """The tmp budget uploads are staged under (checked before ``100 Continue``)."""
        ...

    def check_size(self, declared_length: int | None, limit_bytes: int) -> None:
        """Refuse a declared body (bytes) before reading it."""
        ...

    def stages(self, declared_length: int | None) -> bool:
        """Whether a body of ``declared_length`` bytes is staged (vs stored inline)."""
        ...

    async def put_stream(
        self,
        ref: ArtifactRef | Callable[[str], ArtifactRef],
        body: AsyncIterator[bytes],
        *,
        declared_length: int | None,
        limit_bytes: int,
        content_type: str,
        headers: dict[str, str] | None = None,
        expected_sha256: str | None = None,
    ) -> PutResult:
        """Store a streamed body as a new local version of ``ref`` (or of the ref a function
        gives for the body's SHA-256 hex, once known)."""
        ...

    async def put_inline(self, ref: ArtifactRef, data: bytes, content_type: str) -> PutResult:
        """Store a small body inside its index row."""
        ...

    async def put_batch(
        self, blobs: Sequence[BatchBlob], *, limit_bytes: int, content_type: str
    ) -> list[PutResult | KuraError | None]:
        """Store many bodies under one durable commit (``storage.batch_write``): per blob its
        result, None when already stored intact, or the error that refused it alone."""
        ...

    async def intact(self, ref: ArtifactRef, size_bytes: int | None = None) -> bool:
        """Stored and intact (a damaged copy is quarantined and reads False): what a PUT
        route that skips existing keys asks."""
        ...

    async def delete_namespace(
        self, namespace_id: str, version_ms: int | None = None, *, source: str = "local"
    ) -> int:
        """Tombstone a namespace and delete its artifacts; the tombstone's version (ms)."""
        ...

    async def purge_writer(
        self,
        namespace_id: str,
        writer: str,
        version_ms: int | None = None,
        *,
        source: str = "local",
    ) -> Purge:
        """Delete ``writer``'s entries of ``namespace_id`` on every node and the bucket (a
        replicated clean of one writer, ``storage.write_path``); copies at or below the purge's
        version are ignored from then on. The purge: version (ms), entries and bytes deleted
        here."""
        ...


class Provenance(Protocol):
    """Who wrote what in a namespace, on this node (``storage.provenance``): the writers are
    those recorded at each write (``ArtifactRef.writer``) and carried by every copy. Each call
    scans the namespace's rows once on a reader thread (O(its rows)). An index older than
    schema version 4 (opened read-only, so not migrated) answers every entry as writer
    ``""``."""

    async def writers(self, namespace_id: str) -> list[WriterUsage]:
        """Every writer of ``namespace_id`` with its entries, bytes, newest version (unix ms)
        and how the copies came (``WriterUsage.vias``), most bytes first; empty for a
        namespace with no entry."""
        ...

    async def written_by(self, namespace_id: str, writer: str, limit: int) -> list[Manifest]:
        """At most ``limit`` (>= 1) manifests ``writer`` wrote in ``namespace_id``, newest
        version first."""
        ...

    async def namespaces(self) -> dict[str, tuple[int, int]]:
        """Every namespace holding an entry on this node -> (bytes, entries), measured now by
        one scan of the index (O(rows): about 2 s per million rows without rules, 0.2 s with
        them, ``storage.namespace_usage``)."""
        ...


class ReplicaApplier(Protocol):
    """Where one streamed copy made elsewhere lands (a peer's, or the bucket's on a fill): the
    base of every port that takes copies (``PeerPages``, ``ReplicaSink``, ``ReplicaStore``)."""

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
        """Apply a peer's copy at the peer's version (last writer wins, ``core.version``), never
        enqueued for other peers; staged under ``reservation`` (else a fail-fast one) and, with
        ``background``, on the low-priority background threads. ``FutureVersion`` for a version
        more than ``KURA_MAX_CLOCK_SKEW_MS`` ahead. ``via``: the peer it came from (its
        internal URL), recorded with the row (provenance); ``source`` when unknown."""
        ...


class ReplicaStore(ReplicaApplier, Protocol):
    """Where read-through stores a peer's copy (``mesh.read_through``): the primary's store."""

    @property
    def budget(self) -> TmpBudget:
        """The tmp budget a copy is staged under (reserved before a byte is staged)."""
        ...

    async def replica_outcome(self, manifest: Manifest, source: str) -> ApplyOutcome:
        """What ``apply_replica`` would do with ``manifest`` now, before a byte is read."""
        ...


class PeerPages(ReplicaApplier, Protocol):
    """What the internal routes serve to peers and take from them."""

    def artifact_id_of(self, manifest: Manifest) -> str:
        """The identity ``manifest`` has on this node's tenant."""
        ...

    async def manifests_page(self, after: str | None, limit: int) -> list[Manifest]:
        """Manifests in artifact id order strictly after ``after``."""
        ...

    async def manifests_newest_page(
        self, after: tuple[int, str] | None, limit: int
    ) -> list[Manifest]:
        """Manifests newest first, strictly after the cursor (version_ms, artifact id)."""
        ...

    async def tombstones_page(self, after: str | None, limit: int) -> list[tuple[str, int]]:
        """(namespace id, version ms) in namespace order strictly after ``after``."""
        ...

    async def delete_namespace(
        self, namespace_id: str, version_ms: int | None = None, *, source: str = "local"
    ) -> int:
        """A peer's tombstone (``source`` names it), as ``ArtifactWriter.delete_namespace``."""
        ...

    async def purge_writer(
        self,
        namespace_id: str,
        writer: str,
        version_ms: int | None = None,
        *,
        source: str = "local",
    ) -> Purge:
        """A peer's purge of one writer's entries, as ``ArtifactWriter.purge_writer``."""
        ...

    @property
    def replica_log(self) -> ChangeLog:
        """The node's change feed and range digests (what the ``changes`` and anti-entropy
        routes serve)."""
        ...


class ReplicaSink(ReplicaApplier, Protocol):
    """Where the copies and tombstones this node pulls from peers land (``mesh.bootstrap``,
    ``mesh.bootstrap_batch``, ``mesh.anti_entropy``): each at the peer's version, by last
    writer wins (``core.version``), never enqueued for other peers. A version more than
    ``KURA_MAX_CLOCK_SKEW_MS`` ahead raises ``FutureVersion`` (logged and counted here)."""

    @property
    def stats(self) -> StorageStats:
        """The store's counters; ``used_bytes`` is what the disk budget is measured against."""
        ...

    @property
    def max_disk_bytes(self) -> int:
        """``KURA_MAX_DISK_BYTES``: what the stored bytes are evicted down to."""
        ...

    @property
    def max_inline_bytes(self) -> int:
        """The largest copy (bytes) stored inside its index row (``apply_small_replicas``)."""
        ...

    async def apply_outcome_for(
        self, manifest: Manifest, source: str | None = None
    ) -> ApplyOutcome:
        """What applying ``manifest`` would do now (before its body is fetched); with
        ``source``, ``FutureVersion`` first for a version too far ahead."""
        ...

    async def apply_outcomes_for(self, manifests: Sequence[Manifest]) -> list[ApplyOutcome]:
        """``apply_outcome_for`` (without the skew gate) for many, in one index read."""
        ...

    async def apply_small_replicas(
        self, items: Sequence[tuple[Manifest, bytes]], *, source: str, via: str = ""
    ) -> list[ApplyOutcome | KuraError]:
        """Apply many small copies inline in one transaction: per item its outcome or the
        error that refused it; ``ResourceExhausted``/``Unavailable`` when none could be.
        ``via``: the peer they came from, as ``apply_replica``'s."""
        ...

    async def delete_namespace(
        self, namespace_id: str, version_ms: int | None = None, *, source: str = "local"
    ) -> int:
        """A peer's tombstone (``source`` names who brought it); the tombstone's version."""
        ...

    async def tombstones_page(self, after: str | None, limit: int) -> list[tuple[str, int]]:
        """This node's tombstones, (namespace id, version ms) in namespace order strictly
        after ``after``."""
        ...

    async def evict_to_budget(self) -> None:
        """Evict down to ``max_disk_bytes`` (after a bootstrap's eviction floor held it back)."""
        ...


class WorkerSupport(Protocol):
    """What the primary shares with its worker processes and does with their reports."""

    @property
    def hot(self) -> HotCache:
        """The hot cache, whose generation the workers follow."""
        ...

    @property
    def index_read_only(self) -> bool:
        """Whether the index was opened read-only at start-up (a full disk)."""
        ...

    def note_access(self, accesses: dict[str, int]) -> None:
        """Hits made by a worker: artifact id -> unix ms, for the LRU."""
        ...

    def note_promised(self, promised: dict[str, int]) -> None:
        """Artifacts a worker told clients exist: artifact id -> unix ms told, kept for
        ``KURA_MIN_RETENTION`` (``storage.retention``)."""
        ...

    async def verify_stored(self, artifact_id: str, *, detected_by: str) -> bool:
        """Re-check an entry a worker found damaged (quarantined if it is)."""
        ...

    def record_xxh3_128(self, found: Sequence[tuple[Manifest, str]]) -> None:
        """Checksums a worker computed, recorded if each row is still that version."""
        ...


class PeerQueueView(Protocol):
    """The per-peer outbox queues and catch-up marks as this process sees them now
    (``storage.peer_queue.PeerQueues``). Readable on the event loop at any time: the mappings
    are replaced, never changed in place."""

    @property
    def max_depth_per_peer(self) -> int:
        """``KURA_OUTBOX_MAX_DEPTH``: messages a peer's queue may hold before it is marked."""
        ...

    @property
    def depths(self) -> Mapping[str, int]:
        """Peer URL -> messages queued for it (peers never queued for are absent)."""
        ...

    @property
    def marks(self) -> Mapping[str, CatchUpMark]:
        """Peer URL -> its durable catch-up mark."""
        ...

    @property
    def skipped_total(self) -> Mapping[str, int]:
        """Peer URL -> messages not enqueued for it at its cap since this process started."""
        ...

    def depth(self, peer: str) -> int:
        """Messages queued for ``peer`` (0 if none)."""
        ...


class OutboxLog(Protocol):
    """Replication's outbox as the shipper, catch-up and the object tier use it: each peer's
    queue of messages to deliver and its catch-up mark. Implemented over the metadata index by
    ``storage.replica_log.IndexReplicaLog``.

    Every method is safe to call concurrently from the event loop; none blocks it. A method
    that changes something has made it durable when it returns (``docs/durability.md``)."""

    @property
    def queues(self) -> PeerQueueView:
        """The queues and marks in memory, for decisions on the event loop."""
        ...

    async def outbox_batch(self, peer: str, limit: int) -> list[OutboxMessage]:
        """The oldest ``limit`` messages queued for ``peer``, oldest first; empty while the
        index is read-only. Never held back by a full disk (issue 26: a delivery is what makes
        an artifact pending upload evictable)."""
        ...

    async def outbox_ack(self, ids: Sequence[int]) -> int:
        """Delete delivered messages (only once the peer acknowledged them); the number
        deleted, fewer than ``len(ids)`` (0) when the disk is too full to record it: they are
        delivered again later, which peers apply idempotently (last writer wins). Evicts down
        to ``KURA_MAX_DISK_BYTES`` at once when a delivery left the store over it."""
        ...

    async def outbox_depths(self) -> dict[str, tuple[int, int]]:
        """Peer URL -> (messages queued, enqueue time in Unix ms of the oldest), from the
        index; peers with an empty queue are absent."""
        ...

    async def forget_peer(self, peer: str) -> tuple[int, int]:
        """Drop ``peer``'s whole queue and mark it forgotten, in one transaction (it was away
        for ``KURA_PEER_FORGET_AFTER``, or its queue reached ``KURA_OUTBOX_MAX_DEPTH``).
        Returns (messages dropped, this node's change feed head right after)."""
        ...

    async def reoffer_tombstones(self, peer: str, since_ms: int) -> int:
        """Enqueue for ``peer`` every namespace tombstone and every purge of a writer's entries
        at or above version ``since_ms``, in one transaction; how many (the catch-up of a peer
        no pull catches up, the object-storage tier's among them, ``mesh.catch_up``)."""
        ...

    async def reoffer_purges(self, peer: str, since_ms: int) -> int:
        """Enqueue for ``peer`` every purge of a writer's entries at or above version
        ``since_ms``, in one transaction; how many (a marked peer told to pull: the change feed
        carries tombstones, not purges, ``mesh.catch_up``)."""
        ...

    async def clear_mark(self, peer: str, skipped_at_start: int) -> bool:
        """Remove ``peer``'s catch-up mark, unless messages were skipped for it since
        ``queues.skipped_total[peer]`` was ``skipped_at_start``: then False (catch up again)."""
        ...


class ChangeLog(Protocol):
    """This node's change feed, the cursors into peers' feeds and the anti-entropy range
    digests, as the change-feed pull (``mesh.incremental``), anti-entropy and the internal
    routes use them. Implemented over the metadata index by
    ``storage.replica_log.IndexReplicaLog``.

    Every method is safe to call concurrently from the event loop; none blocks it. A method
    that changes something has made it durable when it returns (``docs/durability.md``)."""

    async def changes_page(self, since: int, limit: int) -> ChangesPage:
        """This node's change feed after change number ``since`` (>= 0), at most ``limit``
        (>= 1) rows, one snapshot (``storage.change_feed``). ``Unavailable`` (503) on an index
        without the change sequence (read-only, written before schema version 3)."""
        ...

    async def load_cursor(self, peer: str) -> PeerCursor | None:
        """How far this node has applied ``peer``'s feed; None if never (or an index without
        cursors)."""
        ...

    async def store_cursor(self, peer: str, epoch: str, seq: int) -> None:
        """Record that ``peer``'s feed of ``epoch`` is applied up to ``seq``. ``Unavailable``
        when it cannot be written (a read-only index, a full disk)."""
        ...

    async def range_digests(self, prefix: str, depth: int) -> RangeDigests:
        """The digests of the ranges ``depth`` hex digits below the hex ``prefix`` (``depth``
        0: the range itself) and of the tombstones. ``ValueError`` unless ``len(prefix) +
        depth`` is one of ``DIGEST_LEVELS``; ``Unavailable`` on an index without digests."""
        ...


async def one_piece(data: bytes) -> AsyncIterator[bytes]:
    """``data`` as the body a write takes (``ArtifactWriter.put_stream``'s ``body``): a blob
    already in memory, in one piece."""
    yield data
