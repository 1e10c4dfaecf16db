"""``OverlayReader`` (``kura.storage.overlay``): a ref of the first namespace is read in each
namespace of the overlay in turn, the first that holds it wins; ``missing`` lists only what
no namespace holds with the size asked; a ref of another namespace is read as named. Over a
hand-written ``FakeReader`` that holds refs and their sizes, and records what it was asked."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from kura.core.errors import NotFound
from kura.core.manifest import Manifest
from kura.storage.artifact import ArtifactRef, StoredBody
from kura.storage.overlay import OverlayReader, overlay_reader


def ref(ns: str, key: str) -> ArtifactRef:
    return ArtifactRef("nx", ns, key)


class FakeReader:
    """Holds ``stored`` (ref -> body bytes); answers like an ``ArtifactReader``."""

    def __init__(self, stored: dict[ArtifactRef, bytes]) -> None:
        self.stored = stored
        self.asked: list[ArtifactRef] = []

    def artifact_id(self, r: ArtifactRef) -> str:
        return f"{r.namespace_id}/{r.key}"

    async def exists(self, r: ArtifactRef) -> bool:
        self.asked.append(r)
        return r in self.stored

    async def read(self, r: ArtifactRef) -> StoredBody:
        self.asked.append(r)
        if r not in self.stored:
            raise NotFound("Artifact not found")
        data = self.stored[r]
        manifest = Manifest(
            artifact_id=self.artifact_id(r),
            producer=r.producer,
            namespace_id=r.namespace_id,
            key=r.key,
            content_type="application/octet-stream",
            size=len(data),
            sha256="0" * 64,
            created_at_ms=1,
            version_ms=1,
        )
        return StoredBody(manifest, data=data)

    async def missing(
        self, refs: Sequence[ArtifactRef], sizes: Sequence[int] | None = None
    ) -> list[ArtifactRef]:
        self.asked.extend(refs)
        wanted = sizes if sizes is not None else [None] * len(refs)
        return [
            r
            for r, size in zip(refs, wanted, strict=True)
            if r not in self.stored or (size is not None and len(self.stored[r]) != size)
        ]


READS = ("pr-123", "main")
STORED = {
    ref("pr-123", "both"): b"the PR's",
    ref("main", "both"): b"main's",
    ref("main", "main-only"): b"main's only",
    ref("main", "sized"): b"12345",
    ref("other", "elsewhere"): b"other's",
}


async def test_a_read_falls_through_in_order_and_the_first_namespace_wins() -> None:
    fake = FakeReader(STORED)
    overlay = OverlayReader(fake, READS)  # type: ignore[arg-type]
    assert (await overlay.read(ref("pr-123", "both"))).data == b"the PR's"
    assert (await overlay.read(ref("pr-123", "main-only"))).data == b"main's only"
    with pytest.raises(NotFound):
        await overlay.read(ref("pr-123", "nowhere"))
    assert await overlay.exists(ref("pr-123", "main-only"))
    assert not await overlay.exists(ref("pr-123", "nowhere"))
    # a ref of another namespace is read as named, never through the overlay
    with pytest.raises(NotFound):
        await overlay.read(ref("other", "main-only"))
    assert (await overlay.read(ref("other", "elsewhere"))).data == b"other's"


async def test_missing_lists_what_no_namespace_holds_with_that_size_asking_each_only_for_the_rest() -> (
    None
):
    fake = FakeReader(STORED)
    overlay = OverlayReader(fake, READS)  # type: ignore[arg-type]
    asked = [ref("pr-123", k) for k in ("both", "main-only", "nowhere", "sized")]
    assert await overlay.missing(asked, [8, 11, 1, 4]) == [
        ref("pr-123", "nowhere"),
        ref("pr-123", "sized"),  # main holds it with 5 bytes, not 4
    ]
    # main was asked only for what pr-123 lacked
    assert ref("main", "both") not in fake.asked
    assert await overlay.missing(asked[:2]) == []


def test_one_namespace_is_the_reader_itself() -> None:
    fake = FakeReader(STORED)
    assert overlay_reader(fake, ("main",)) is fake  # type: ignore[arg-type]
    assert isinstance(overlay_reader(fake, READS), OverlayReader)  # type: ignore[arg-type]
