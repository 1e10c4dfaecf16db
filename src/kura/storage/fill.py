"""``FillingReader``: an ``ArtifactReader`` that fills a local miss from a source (bazel-remote's
proxy shape: the disk cache wraps a small ``Get``/``Contains`` backend at construction).

The composition root (``kura.app``) stacks them once: ``FillingReader(FillingReader(
store.reads, tier), read_through)`` asks the local store, then the bucket
(``storage.object_tier``), then the peers (``mesh.read_through``). Storage never calls up: it answers a miss as a miss, and the
wrapper asks its ``FillSource``, which stores what it got (``apply_replica``, never
replicated) and says so with a ``Filled``, or answers None (a miss there too).

Only ``read`` and ``missing`` fill; ``exists``, ``read_manifest``, ``read_by_id`` and
``read_many`` (what peers, the shipper and the scrub ask) answer from the inner reader alone,
as they did when the mesh was a hook of storage's. Safe to call concurrently if the inner
reader and the source are (a source shares one fetch among concurrent misses of one id).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from kura.core.errors import NotFound
from kura.storage.artifact import ArtifactRef, StoredBody
from kura.storage.ports import ArtifactReader
from kura.storage.reader_wrapper import ReaderWrapper


@dataclass(frozen=True)
class Filled:
    """A source got the artifact: stored in the inner reader now (``body`` None: read it
    there), or a verified body in memory (``body.data``) to serve while it is being stored
    (``mesh.read_through``: served before it is durable)."""

    body: StoredBody | None = None


class FillSource(Protocol):
    """Where a local miss is asked next (the bucket, the peers)."""

    async def fill(self, artifact_id: str, namespace_id: str) -> Filled | None:
        """Fetch artifact ``artifact_id`` of ``namespace_id`` and store it locally; None when
        the source does not have it or cannot answer now (its errors are logged, counted and
        read as a miss, never raised)."""
        ...


class FillingReader(ReaderWrapper):
    """``inner`` with its misses asked of ``source`` (module docstring)."""

    def __init__(
        self,
        inner: ArtifactReader,
        source: FillSource,
        *,
        note_read: Callable[[str], None] = lambda artifact_id: None,
    ) -> None:
        """``note_read(artifact_id)``: a read served from a body in memory, to be noted as a
        use like any other read (the LRU, ``KURA_MAX_AGE`` and the bucket's touch markers);
        a stored fill is read back from ``inner``, which notes it."""
        super().__init__(inner)
        self._source = source
        self._note_read = note_read

    async def exists(self, ref: ArtifactRef) -> bool:
        return await self._inner.exists(ref)

    async def read(self, ref: ArtifactRef) -> StoredBody:
        """The inner reader's body; on its ``NotFound``, the source's (a body in memory, or
        the one it stored, read back from ``inner``); ``NotFound`` when neither has it. Either
        way the read is noted as a use, as a local hit is."""
        try:
            return await self._inner.read(ref)
        except NotFound:
            aid = self._inner.artifact_id(ref)
            filled = await self._source.fill(aid, ref.namespace_id)
            if filled is None:
                raise
        if filled.body is None:
            return await self._inner.read(ref)  # stored now: a hit there, noted there
        self._note_read(aid)
        return filled.body

    async def missing(
        self, refs: Sequence[ArtifactRef], sizes: Sequence[int] | None = None
    ) -> list[ArtifactRef]:
        """The inner reader's missing refs (in order) less those the source fills: each absent
        one in turn, stopping at the first it cannot have (so a miss may list only one). One
        stored with another size than ``sizes`` asks is never asked of the source (a content
        digest names one size). The refs past the first absent one were not asked of the inner
        reader's own sources (it stopped there too): each is asked of the inner reader again
        first, so a stack of wrappers asks every source for each ref in turn, and once."""
        miss = await self._inner.missing(refs, sizes)
        size_of = dict(zip(refs, sizes, strict=True)) if sizes is not None else None
        still: list[ArtifactRef] = []
        past_first = False  # the inner reader's sources stopped at its first absent ref
        for n, ref in enumerate(miss):
            size = None if size_of is None else [size_of[ref]]
            if past_first and not await self._inner.missing([ref], size):
                continue
            if await self._inner.exists(ref):
                still.append(ref)  # stored with another size
                continue
            past_first = True
            if await self._source.fill(self._inner.artifact_id(ref), ref.namespace_id) is None:
                still.extend(miss[n:])
                break
        return still
