"""The replica log's public vocabulary (the types of ``storage.ports.OutboxLog`` and
``ChangeLog``): outbox message kinds and one pending delivery, a peer's catch-up mark, a page of
the change feed, a cursor into a peer's feed, and the anti-entropy range digests.

The rows live in the metadata index (table ``outbox``, written in the same transaction as the
data change: ``storage.index``; read by ``storage.outbox_queries``, deleted by
``storage.peer_queue``; marks by ``storage.peer_queue``, the feed and cursors by
``storage.change_feed``, digests by ``storage.digests``). This module holds no SQL, so the mesh
and the API may import it while the SQLite modules stay private to ``kura.storage`` (an
import-linter contract in ``pyproject.toml``).
"""

from __future__ import annotations

from dataclasses import dataclass

from kura.core.manifest import Manifest

UPSERT = "upsert_artifact"
DELETE_NAMESPACE = "delete_namespace"
# A purge of one writer's entries of a namespace (``ArtifactWriter.purge_writer``): its row
# carries the namespace and the purge version, and the writer in ``artifact_id`` (unused by a
# namespace-wide message; no artifact id looks like a writer, so the eviction's look-up of
# pending uploads by artifact id never matches it).
PURGE_WRITER = "purge_writer"

# The lengths of the hex prefixes that have a range digest: everything, 256 and 65,536 ranges.
DIGEST_LEVELS = (0, 2, 4)
DIGEST_DEEPEST = DIGEST_LEVELS[-1]


@dataclass(frozen=True)
class OutboxMessage:
    """One pending delivery to one peer. ``kind`` is UPSERT, DELETE_NAMESPACE or
    PURGE_WRITER (whose writer is ``writer``)."""

    id: int
    peer: str
    kind: str
    artifact_id: str
    namespace_id: str
    version_ms: int
    enqueued_at_ms: int

    @property
    def writer(self) -> str:
        """The writer a PURGE_WRITER message purges (stored in ``artifact_id``), else ``""``."""
        return self.artifact_id if self.kind == PURGE_WRITER else ""


@dataclass(frozen=True)
class CatchUpMark:
    """One peer marked to be caught up (``storage.peer_queue``). Times are Unix milliseconds;
    ``reason`` is ``"overflow"`` or ``"absent"``; ``forgotten_at_ms`` is None unless its queue
    was dropped (absent too long, or at its cap: ``mesh.catch_up``)."""

    peer: str
    reason: str
    marked_at_ms: int
    since_ms: int
    forgotten_at_ms: int | None
    dropped_messages: int


@dataclass(frozen=True)
class ChangesPage:
    """One page of the feed. ``tombstones`` are (namespace_id, version_ms); ``next_since`` is
    the ``since`` of the next page (``head_seq`` when ``more`` is False)."""

    epoch: str
    head_seq: int
    tombstones: list[tuple[str, int]]
    manifests: list[Manifest]
    next_since: int
    more: bool


@dataclass(frozen=True)
class PeerCursor:
    """How far this node has applied ``peer``'s change feed of ``epoch``: every change numbered
    up to ``seq``."""

    peer: str
    epoch: str
    seq: int


@dataclass(frozen=True)
class RangeDigests:
    """The range digests under one prefix, as ``GET /_internal/anti_entropy/digests`` serves
    them: ``ranges`` are (prefix, rows, digest) of the non-empty ranges in prefix order (one
    left out is empty), ``tombstones`` is (count, digest) over every namespace tombstone. A
    digest is 16 lowercase hex digits (``storage.digests``)."""

    ranges: list[tuple[str, int, str]]
    tombstones: tuple[int, str]
