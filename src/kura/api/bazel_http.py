"""Bazel's HTTP remote cache: ``{prefix}/ac/{sha256}`` and ``{prefix}/cas/{sha256}``.

Bazel 4 (clients.md) GETs ``ac/`` (404 is a miss), PUTs its outputs to ``cas/`` and then the
ActionResult to ``ac/``. A ``cas/`` body must hash to the digest in its path (400 otherwise, and
nothing is stored); a ``cas/`` entry that is already stored and intact is not re-read (a damaged one is
quarantined and replaced by the new body). ``{prefix}`` is
``KURA_HTTP_CACHE_PREFIX`` (default ``/cache``).

``ac/`` follows the rules in ``kura.api.action_cache``: an upload must be a valid
``ActionResult`` of at most 4 MiB (400 / 413 otherwise, nothing stored), and a GET is a hit only
while every CAS blob the entry references (outputs, stdout, stderr, every file of every output
``Tree``) is stored, else 404 counted as a miss; the referenced blobs are touched on a hit. A
stored entry that no longer parses is a miss too. ccache's ``bazel`` layout keys
(``action_cache.is_ccache_key``) are stored and served raw. CAS blobs are stored as
``ArtifactRef("bazel", namespace, "cas/<hex>")``: namespace ``""``, or the one the path names
under ``/ns/{namespace}`` (``kura.api.scope``); an action result's references are looked up in
its own namespace.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from aiohttp import web
from buildgrid.common.protos.build.bazel.remote.execution.v2 import (
    remote_execution_pb2 as reapi,
)

from kura.api.action_cache import (
    EMPTY_SHA256,
    MAX_ACTION_RESULT_BYTES,
    blob_references,
    is_ccache_key,
    parse_action_result,
    tree_file_references,
    tree_references,
)
from kura.api.auth import Access
from kura.api.blob import serve, store
from kura.api.http import count_lookup, ctx, endpoint, read_small_body
from kura.api.partial_content import ranged_response
from kura.api.scope import path_namespace
from kura.core.errors import InvalidRequest, NotFound
from kura.core.keys import HEX_SHA256, validate
from kura.storage.service import ArtifactRef, CacheService, StoredBody

PROTOCOL = "bazel"
# A Tree larger than this is not read to check its files: the entry reads as a miss.
MAX_TREE_BYTES = 64 * 1024 * 1024


def _ref(request: web.Request, kind: str) -> ArtifactRef:
    digest = validate(request.match_info["digest"], HEX_SHA256, f"{kind} digest")
    return ArtifactRef("bazel", path_namespace(request), f"{kind}/{digest}")


def _cas(namespace: str, digest: str) -> ArtifactRef:
    return ArtifactRef("bazel", namespace, f"cas/{digest}")


@endpoint(PROTOCOL, Access.READ)
async def get_ac(request: web.Request) -> web.StreamResponse:
    ref = _ref(request, "ac")
    if is_ccache_key(request.match_info["digest"]):
        return await serve(request, ref, PROTOCOL)
    service = ctx(request).service
    try:
        body = await service.read(ref)
        data = await _bytes(body, MAX_ACTION_RESULT_BYTES)
        if data is None:
            raise NotFound("stored action result is larger than an ActionResult can be")
        try:
            result = parse_action_result(data)
        except InvalidRequest:
            raise NotFound("stored action result does not parse; treated as a miss") from None
        missing = await _missing_blobs(service, ref.namespace_id, result)
        if missing:
            raise NotFound(
                f"action result references {len(missing)} CAS blob(s) that are not stored "
                f"(first: {missing[0]}); treated as a miss"
            )
    except NotFound:
        count_lookup(request, PROTOCOL, False)
        raise
    count_lookup(request, PROTOCOL, True)
    return await ranged_response(request, StoredBody(body.manifest, data=data), PROTOCOL)


@endpoint(PROTOCOL, Access.READ)
async def get_cas(request: web.Request) -> web.StreamResponse:
    return await serve(request, _ref(request, "cas"), PROTOCOL)


@endpoint(PROTOCOL, Access.WRITE, body_limit=lambda s: s.max_artifact_bytes)
async def put_ac(request: web.Request) -> web.StreamResponse:
    ref = _ref(request, "ac")
    c = ctx(request)
    if is_ccache_key(request.match_info["digest"]):
        await store(request, ref, PROTOCOL, limit_bytes=c.settings.max_artifact_bytes)
        return web.Response(status=200)
    limit = min(MAX_ACTION_RESULT_BYTES, c.settings.max_artifact_bytes)
    data = await read_small_body(request, limit, PROTOCOL)
    parse_action_result(data)
    await c.service.put_stream(
        ref,
        _once(data),
        declared_length=len(data),
        limit_bytes=limit,
        content_type=request.headers.get("Content-Type") or "application/octet-stream",
    )
    return web.Response(status=200)


@endpoint(PROTOCOL, Access.WRITE, body_limit=lambda s: s.max_artifact_bytes)
async def put_cas(request: web.Request) -> web.StreamResponse:
    ref = _ref(request, "cas")
    c = ctx(request)
    if not await c.service.intact(ref):
        await store(
            request,
            ref,
            PROTOCOL,
            limit_bytes=c.settings.max_artifact_bytes,
            expected_sha256=request.match_info["digest"],
        )
    return web.Response(status=200)


async def _missing_blobs(
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
            tree = await service.read(_cas(namespace, tree_hash))
        except NotFound:
            return [tree_hash]
        data = await _bytes(tree, MAX_TREE_BYTES)
        files = None if data is None else await asyncio.to_thread(tree_file_references, data)
        if files is None:
            return [tree_hash]
        hashes.extend(files)
    unique = list(dict.fromkeys(hashes))
    missing = await service.missing([_cas(namespace, h) for h in unique])
    return [m.key.removeprefix("cas/") for m in missing]


async def _bytes(body: StoredBody, limit_bytes: int) -> bytes | None:
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


async def _once(data: bytes) -> AsyncIterator[bytes]:
    yield data


def routes(prefix: str) -> list[web.RouteDef]:
    return [
        web.get(prefix + "/ac/{digest}", get_ac, allow_head=True),
        web.put(prefix + "/ac/{digest}", put_ac),
        web.get(prefix + "/cas/{digest}", get_cas, allow_head=True),
        web.put(prefix + "/cas/{digest}", put_cas),
    ]
