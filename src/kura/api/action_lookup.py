"""The action-cache look-up both protocols share: a stored ``ActionResult`` is a hit only while
every CAS blob it references is stored (the rules are in ``kura.api.action_cache``).

Used by the Bazel HTTP cache (``kura.api.bazel_http``, ``GET {prefix}/ac/{sha256}``) and by the
REAPI ``ActionCache.GetActionResult`` over gRPC (``kura.grpc.action_cache``), on the same
``ArtifactRef("bazel", namespace, "ac/<hex>")`` and ``"cas/<hex>"`` keys, so an entry written
over one protocol is found by the other. No aiohttp here.
"""

from __future__ import annotations

import asyncio

from buildgrid.common.protos.build.bazel.remote.execution.v2 import (
    remote_execution_pb2 as reapi,
)

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
from kura.storage.service import ArtifactRef, CacheService, StoredBody

PRODUCER = "bazel"
# A Tree larger than this is not read to check its files: the entry reads as a miss.
MAX_TREE_BYTES = 64 * 1024 * 1024


def cas_ref(namespace: str, sha256: str) -> ArtifactRef:
    """The CAS blob ``sha256`` (64 lowercase hex digits) of ``namespace``."""
    return ArtifactRef(PRODUCER, namespace, f"cas/{sha256}")


def ac_ref(namespace: str, sha256: str) -> ArtifactRef:
    """The action-cache entry of the action digest ``sha256`` in ``namespace``."""
    return ArtifactRef(PRODUCER, namespace, f"ac/{sha256}")


async def find_action_result(
    service: CacheService, ref: ArtifactRef
) -> tuple[Manifest, bytes, reapi.ActionResult]:
    """The stored entry ``ref`` as (manifest, serialized bytes, parsed result).

    Raises ``NotFound`` when it is absent, larger than ``MAX_ACTION_RESULT_BYTES``, does not
    parse, or references a CAS blob that is not stored (``missing_blobs``)."""
    body = await service.read(ref)
    data = await read_all(body, MAX_ACTION_RESULT_BYTES)
    if data is None:
        raise NotFound("stored action result is larger than an ActionResult can be")
    try:
        result = parse_action_result(data)
    except InvalidRequest:
        raise NotFound("stored action result does not parse; treated as a miss") from None
    missing = await missing_blobs(service, ref.namespace_id, result)
    if missing:
        raise NotFound(
            f"action result references {len(missing)} CAS blob(s) that are not stored "
            f"(first: {missing[0]}); treated as a miss"
        )
    return body.manifest, data, result


async def missing_blobs(
    service: CacheService, namespace: str, result: reapi.ActionResult
) -> list[str]:
    """Hashes of the CAS blobs ``result`` references that are not stored (empty: a hit).

    A Tree that is absent, too large or does not parse counts as missing itself.
    """
    hashes = blob_references(result)
    for tree_hash in tree_references(result):
        if tree_hash == EMPTY_SHA256:
            continue
        try:
            tree = await service.read(cas_ref(namespace, tree_hash))
        except NotFound:
            return [tree_hash]
        data = await read_all(tree, MAX_TREE_BYTES)
        files = None if data is None else await asyncio.to_thread(tree_file_references, data)
        if files is None:
            return [tree_hash]
        hashes.extend(files)
    unique = list(dict.fromkeys(hashes))
    missing = await service.missing([cas_ref(namespace, h) for h in unique])
    return [m.key.removeprefix("cas/") for m in missing]


async def read_all(body: StoredBody, limit_bytes: int) -> bytes | None:
    """The whole body in memory (closing its file), or None when it exceeds ``limit_bytes``."""
    try:
        if body.data is not None:
            return body.data if len(body.data) <= limit_bytes else None
        if body.manifest.size > limit_bytes:
            return None
        assert body.file is not None
        return await asyncio.to_thread(body.file.read)
    finally:
        body.close()
