"""``OverlayReader``: an ``ArtifactReader`` that reads a ref in each namespace of an overlay in
turn (``kura.core.overlay``): a miss in the first falls through to the next, a hit anywhere
is a hit. The one place a list of namespaces is tried: every protocol's look-ups (HTTP GET and
HEAD, Nx, Turborepo, the action caches' completeness checks, FindMissingBlobs, BatchReadBlobs,
ByteStream Read, GetTree) go through ``read``, ``exists`` and ``missing``.

It wraps the stacked reader of the composition root (local store, bucket, peers), once per
request whose credential has an overlay (``overlay_reader``); a request reading one namespace
gets the stacked reader itself, at no cost. So each namespace is asked everywhere before the
next one is: a pull request's own entry on a peer wins over main's entry here.

Only refs of the first namespace fall through (the handlers name it, ``NamespaceView.home``);
a ref of any other namespace is read as named. ``read_manifest``, ``read_by_id`` and
``read_many`` address one artifact id, and answer from the inner reader alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from kura.core.errors import NotFound
from kura.storage.artifact import ArtifactRef, StoredBody
from kura.storage.ports import ArtifactReader
from kura.storage.reader_wrapper import ReaderWrapper


def each_namespace(reader: ArtifactReader, ref: ArtifactRef) -> list[ArtifactRef]:
    """``ref``, and when ``reader`` reads through an overlay whose first namespace is
    ``ref``'s, ``ref`` in each later namespace, in order. For a look-up whose stored answer can
    be there but unusable (an action result whose blobs were evicted, an expired asset record,
    a key-value entry whose objects are gone): it tries each in turn, so that such an entry in
    an earlier namespace does not hide a usable one in a later namespace ("a hit anywhere is a
    hit"). Reading the first through ``reader`` falls through as ``read`` does; the later ones
    name their namespace and are read as named."""
    return reader.each(ref) if isinstance(reader, OverlayReader) else [ref]


def overlay_reader(inner: ArtifactReader, reads: tuple[str, ...]) -> ArtifactReader:
    """``inner`` reading through ``reads`` in order (``inner`` itself for one namespace)."""
    return inner if len(reads) < 2 else OverlayReader(inner, reads)


class OverlayReader(ReaderWrapper):
    """``inner`` with refs of ``reads[0]`` read in each of ``reads`` in turn (module
    docstring). Safe to call concurrently when ``inner`` is."""

    def __init__(self, inner: ArtifactReader, reads: tuple[str, ...]) -> None:
        super().__init__(inner)
        self._reads = reads

    def each(self, ref: ArtifactRef) -> list[ArtifactRef]:
        """``ref`` in each namespace it is read in, in order (``each_namespace``)."""
        if ref.namespace_id != self._reads[0]:
            return [ref]
        return [ref, *(replace(ref, namespace_id=ns) for ns in self._reads[1:])]

    async def exists(self, ref: ArtifactRef) -> bool:
        for each in self.each(ref):
            if await self._inner.exists(each):
                return True
        return False

    async def read(self, ref: ArtifactRef) -> StoredBody:
        """The first namespace's body that the inner reader has; its last ``NotFound``."""
        refs = self.each(ref)
        for each in refs[:-1]:
            try:
                return await self._inner.read(each)
            except NotFound:
                continue
        return await self._inner.read(refs[-1])

    async def missing(
        self, refs: Sequence[ArtifactRef], sizes: Sequence[int] | None = None
    ) -> list[ArtifactRef]:
        """The refs (of ``refs``, in order) that no namespace holds (with the size ``sizes``
        asks): each namespace is asked only for what the ones before it lacked."""
        size_of = dict(zip(refs, sizes, strict=True)) if sizes is not None else None
        left = await self._inner.missing(refs, sizes)
        for ns in self._reads[1:]:
            falls = [r for r in left if r.namespace_id == self._reads[0]]
            if not falls:
                break
            there = [replace(r, namespace_id=ns) for r in falls]
            still = await self._inner.missing(
                there, None if size_of is None else [size_of[r] for r in falls]
            )
            gone = {(r.producer, r.key) for r in there} - {(r.producer, r.key) for r in still}
            left = [
                r
                for r in left
                if r.namespace_id != self._reads[0] or (r.producer, r.key) not in gone
            ]
        return left
