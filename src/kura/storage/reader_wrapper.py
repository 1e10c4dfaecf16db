"""``ReaderWrapper``: the base of an ``ArtifactReader`` that wraps another and changes some of
its look-ups (``storage.fill.FillingReader`` fills misses, ``storage.overlay.OverlayReader``
reads through several namespaces). What neither changes, it passes to ``inner`` as is: the
calls that address one artifact id (``read_manifest``, ``read_by_id``, ``read_many``: what
peers, the shipper and the scrub ask) and the bookkeeping (``report_corrupt``,
``record_xxh3_128``, ``verifier``, ``artifact_id``). A subclass implements ``exists``,
``read`` and ``missing``.
"""

from __future__ import annotations

from collections.abc import Sequence

from kura.core.manifest import Manifest
from kura.storage.artifact import ArtifactRef, StoredBody
from kura.storage.ports import ArtifactReader
from kura.storage.verify import ReadVerifier


class ReaderWrapper:
    """Passes the module docstring's calls to ``inner``."""

    def __init__(self, inner: ArtifactReader) -> None:
        self._inner = inner

    @property
    def verifier(self) -> ReadVerifier:
        return self._inner.verifier

    def artifact_id(self, ref: ArtifactRef) -> str:
        return self._inner.artifact_id(ref)

    async def read_manifest(self, aid: str) -> Manifest | None:
        return await self._inner.read_manifest(aid)

    async def read_by_id(self, aid: str, *, hashed: bool = False) -> StoredBody:
        return await self._inner.read_by_id(aid, hashed=hashed)

    async def read_many(
        self, aids: Sequence[str], *, as_reads: bool = False
    ) -> list[StoredBody | None]:
        return await self._inner.read_many(aids, as_reads=as_reads)

    async def report_corrupt(self, manifest: Manifest, detected_by: str) -> bool:
        return await self._inner.report_corrupt(manifest, detected_by)

    def record_xxh3_128(self, found: Sequence[tuple[Manifest, str]]) -> None:
        self._inner.record_xxh3_128(found)
