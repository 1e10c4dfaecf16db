"""``StartupGatedWriter``: the one gate every client's write passes while start-up's background
work runs (``storage.startup_work``), an ``ArtifactWriter`` over the store's own, composed in
``kura.app`` for every client's listener (public HTTP, gRPC, the admin routes; the peers'
internal listener writes to the store directly).

Each write waits for the work to be done (``StartupWork.wait_writable``, at most
``KURA_STARTUP_WAIT_SECONDS``) *before* it stages or reads a byte of its body, and is refused
at once (503 with ``Retry-After``) when the work's estimate of the time left is past that wait:
a body uploaded only to be refused would be uploaded again, and would hold tmp budget other
writes need meanwhile. ``check_size``, which the HTTP routes call before they read a body
(``api.expect``), refuses on the same estimate. The store keeps its own wait just before a
commit (``CacheService._writes_open``) as a backstop, and for the writes that do not come
through here (peers' copies and cleans, bootstrap, multipart completions), which it gates
alone.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence

from kura.core.errors import KuraError
from kura.storage.artifact import ArtifactRef, BatchBlob, Purge, PutResult
from kura.storage.budget import TmpBudget
from kura.storage.ports import ArtifactWriter
from kura.storage.startup_work import StartupWork


class StartupGatedWriter:
    """``inner``'s writes, each after ``startup.wait_writable()`` (module docstring); reads
    (``intact``) and the checks are passed on as they are."""

    def __init__(self, inner: ArtifactWriter, startup: StartupWork) -> None:
        self._inner = inner
        self._startup = startup

    @property
    def budget(self) -> TmpBudget:
        return self._inner.budget

    def check_size(self, declared_length: int | None, limit_bytes: int) -> None:
        """``inner.check_size``, after ``Unavailable`` when start-up refuses writes now
        (``StartupWork.refuses_writes_now``): before a body is read."""
        if self._startup.refuses_writes_now():
            raise self._startup.unavailable()
        self._inner.check_size(declared_length, limit_bytes)

    def stages(self, declared_length: int | None) -> bool:
        return self._inner.stages(declared_length)

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
        await self._startup.wait_writable()
        return await self._inner.put_stream(
            ref,
            body,
            declared_length=declared_length,
            limit_bytes=limit_bytes,
            content_type=content_type,
            headers=headers,
            expected_sha256=expected_sha256,
        )

    async def put_inline(self, ref: ArtifactRef, data: bytes, content_type: str) -> PutResult:
        await self._startup.wait_writable()
        return await self._inner.put_inline(ref, data, content_type)

    async def put_batch(
        self, blobs: Sequence[BatchBlob], *, limit_bytes: int, content_type: str
    ) -> list[PutResult | KuraError | None]:
        await self._startup.wait_writable()
        return await self._inner.put_batch(
            blobs, limit_bytes=limit_bytes, content_type=content_type
        )

    async def intact(self, ref: ArtifactRef, size_bytes: int | None = None) -> bool:
        return await self._inner.intact(ref, size_bytes)

    async def delete_namespace(
        self, namespace_id: str, version_ms: int | None = None, *, source: str = "local"
    ) -> int:
        await self._startup.wait_writable()
        return await self._inner.delete_namespace(namespace_id, version_ms, source=source)

    async def purge_writer(
        self,
        namespace_id: str,
        writer: str,
        version_ms: int | None = None,
        *,
        source: str = "local",
    ) -> Purge:
        await self._startup.wait_writable()
        return await self._inner.purge_writer(namespace_id, writer, version_ms, source=source)
