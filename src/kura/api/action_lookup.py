"""The action-cache look-up both protocols share: a stored ``ActionResult`` is a hit only while
every CAS blob it references is stored (the rules are in ``kura.api.action_cache``).

Used by the Bazel HTTP cache (``kura.api.bazel_http``, ``GET {prefix}/ac/{sha256}``) and by the
REAPI ``ActionCache.GetActionResult`` over gRPC (``kura.grpc.action_cache``), on the same
``ArtifactRef("bazel", namespace, "ac/<hex>")`` and ``"cas/<hex>"`` keys, so an entry written
over one protocol is found by the other. No aiohttp here.

The completeness check reads the output directories' ``Tree`` blobs, which can be far larger
than the entry naming them, so one look-up is bounded (``TreeBounds``): each distinct Tree is
read and parsed once (in a worker thread), their sizes together may not pass
``KURA_ACTION_CACHE_TREE_MAX_BYTES`` and the whole check may not take longer than
``KURA_ACTION_CACHE_CHECK_SECONDS``. Past either bound the entry is a miss (``TreesTooCostly``,
a ``NotFound``): Bazel then runs the action and uploads a fresh result, where an error would fail
the build. Issue 26: a 9.6 KB entry naming one 8 MB Tree 120 times cost 16.7 s and 1 GB of RAM
on every look-up, each Tree read and parsed once per output directory.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from kura.api.action_cache import (
    EMPTY_SHA256,
    MAX_ACTION_RESULT_BYTES,
    blob_references,
    parse_action_result,
    tree_file_references,
    tree_references,
)
from kura.core.errors import InvalidRequest, NotFound
from kura.core.manifest import Manifest
from kura.protos.build.bazel.remote.execution.v2 import (
    remote_execution_pb2 as reapi,
)
from kura.settings import Settings
from kura.storage.artifact import ArtifactRef, StoredBody
from kura.storage.overlay import each_namespace
from kura.storage.ports import ArtifactReader

PRODUCER = "bazel"
MISSING_BATCH = 8192  # CAS references looked up in one index query


@dataclass(frozen=True)
class TreeBounds:
    """What one look-up may spend on its Trees: ``max_bytes`` of distinct Trees read in all
    (``KURA_ACTION_CACHE_TREE_MAX_BYTES``), ``seconds`` for the whole completeness check
    (``KURA_ACTION_CACHE_CHECK_SECONDS``); the defaults are the settings' defaults."""

    max_bytes: int = 64 * 1024 * 1024
    seconds: float = 10.0


def tree_bounds(settings: Settings) -> TreeBounds:
    """The ``TreeBounds`` ``settings`` set."""
    return TreeBounds(settings.action_cache_tree_max_bytes, settings.action_cache_check_seconds)


class TreesTooCostly(NotFound):
    """The completeness check passed a ``TreeBounds`` bound: the entry is answered as a miss."""


def cas_ref(namespace: str, sha256: str, writer: str = "") -> ArtifactRef:
    """The CAS blob ``sha256`` (64 lowercase hex digits) of ``namespace``; for a write, as
    written by ``writer`` (``NamespaceView.writer``, ``kura.core.provenance``)."""
    return ArtifactRef(PRODUCER, namespace, f"cas/{sha256}", writer)


def ac_ref(namespace: str, sha256: str, writer: str = "") -> ArtifactRef:
    """The action-cache entry of the action digest ``sha256`` in ``namespace``; for a write,
    as written by ``writer``."""
    return ArtifactRef(PRODUCER, namespace, f"ac/{sha256}", writer)


async def find_action_result(
    service: ArtifactReader, ref: ArtifactRef, bounds: TreeBounds
) -> tuple[Manifest, bytes, reapi.ActionResult]:
    """The stored entry ``ref`` as (manifest, serialized bytes, parsed result): the first
    whole one of the namespaces ``service`` reads ``ref`` in (``storage.overlay``).

    Raises ``NotFound`` when it is absent, larger than ``MAX_ACTION_RESULT_BYTES``, does not
    parse, or references a CAS blob that is not stored (``missing_blobs``), and
    ``TreesTooCostly`` (a ``NotFound``) when checking its Trees would pass ``bounds``; the
    first namespace's reason when none has a whole entry."""
    first: NotFound | None = None
    for each in each_namespace(service, ref):
        try:
            return await _whole_action_result(service, each, bounds)
        except NotFound as exc:
            first = first or exc
    assert first is not None
    raise first


async def _whole_action_result(
    service: ArtifactReader, ref: ArtifactRef, bounds: TreeBounds
) -> tuple[Manifest, bytes, reapi.ActionResult]:
    body = await service.read(ref)
    data = await read_all(body, MAX_ACTION_RESULT_BYTES)
    if data is None:
        raise NotFound("stored action result is larger than an ActionResult can be")
    try:
        result = parse_action_result(data)
    except InvalidRequest:
        raise NotFound("stored action result does not parse; treated as a miss") from None
    missing = await missing_blobs(service, ref.namespace_id, result, bounds)
    if missing:
        raise NotFound(
            f"action result references {len(missing)} CAS blob(s) that are not stored "
            f"(first: {missing[0]}); treated as a miss"
        )
    await service.missing([ref])  # a hit: the entry is promised too, with its blobs (retention)
    return body.manifest, data, result


async def missing_blobs(
    service: ArtifactReader, namespace: str, result: reapi.ActionResult, bounds: TreeBounds
) -> list[str]:
    """Hashes of the CAS blobs ``result`` references that are not stored with the size their
    digest names (empty: a hit; a miss may list only the first few it found).

    A Tree that is absent, stored with another size, or does not parse counts as missing
    itself. Raises ``TreesTooCostly`` when the distinct Trees add up to more than
    ``bounds.max_bytes`` or the check takes longer than ``bounds.seconds`` (module docstring)."""
    try:
        async with asyncio.timeout(bounds.seconds):
            digests = blob_references(result)
            spent_bytes = 0
            for tree_hash, tree_size in dict.fromkeys(tree_references(result)):  # each once
                if tree_hash == EMPTY_SHA256:
                    continue
                try:
                    tree = await service.read(cas_ref(namespace, tree_hash))
                except NotFound:
                    return [tree_hash]
                if tree.manifest.size != tree_size:
                    tree.close()
                    return [tree_hash]
                spent_bytes += tree.manifest.size
                if spent_bytes > bounds.max_bytes:
                    tree.close()
                    raise TreesTooCostly(
                        f"the action result's distinct output-directory Trees add up to more "
                        f"than {bounds.max_bytes} bytes (KURA_ACTION_CACHE_TREE_MAX_BYTES); "
                        "treated as a miss"
                    )
                data = await read_all(tree, bounds.max_bytes)
                files = (
                    None if data is None else await asyncio.to_thread(tree_file_references, data)
                )
                if files is None:
                    return [tree_hash]
                digests += [(tree_hash, tree_size), *files]  # the Tree promised too (retention)
            unique = list(dict.fromkeys(digests))
            missing: list[ArtifactRef] = []
            # In batches: the loop gets a turn (and the time bound a chance) between them.
            for start in range(0, len(unique), MISSING_BATCH):
                batch = unique[start : start + MISSING_BATCH]
                missing = await service.missing(
                    [cas_ref(namespace, h) for h, _size in batch], [size for _h, size in batch]
                )
                if missing:
                    break
    except TimeoutError:
        raise TreesTooCostly(
            f"checking the action result's outputs took longer than {bounds.seconds:g} s "
            "(KURA_ACTION_CACHE_CHECK_SECONDS); treated as a miss"
        ) from None
    return [m.key.removeprefix("cas/") for m in missing]


async def read_all(body: StoredBody, limit_bytes: int) -> bytes | None:
    """The whole body in memory (closing its file), or None when it exceeds ``limit_bytes``.

    The file is read in a thread. Cancelled meanwhile (``TreeBounds.seconds``, a client
    gone), this raises at once and the file is closed when the read has returned, as
    ``storage.offload.open_for_writing`` does: closing a buffered file while another thread
    reads it waits for that read to return, which would block the event loop."""
    close_now = True
    try:
        if body.data is not None:
            return body.data if len(body.data) <= limit_bytes else None
        if body.manifest.size > limit_bytes:
            return None
        assert body.file is not None
        job = asyncio.get_running_loop().run_in_executor(None, body.file.read)
        try:
            return await asyncio.shield(job)
        except asyncio.CancelledError:
            close_now = False
            job.add_done_callback(lambda done: _close_after(done, body))
            raise
    finally:
        if close_now:
            body.close()


def _close_after(done: asyncio.Future[bytes], body: StoredBody) -> None:
    """Close ``body`` once the read its caller gave up on has ended (its outcome retrieved)."""
    if not done.cancelled():
        done.exception()
    body.close()
