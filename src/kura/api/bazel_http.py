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
(``action_cache.is_ccache_key``) are stored and served raw. A name under ``ac/`` that is not
64 characters long is not Bazel's: it is a ccache ``subdirs`` key and goes to the plain HTTP
cache (``routes``). CAS blobs are stored as
``ArtifactRef("bazel", namespace, "cas/<hex>")``: namespace ``""``, or the one the path names
under ``/ns/{namespace}`` (``kura.api.scope``), or the credential's overlay
(``kura.core.overlay``); an action result's references are looked up in the namespaces the
request reads, in order (``kura.api.action_lookup``, shared with the gRPC ActionCache).
"""

from __future__ import annotations

from aiohttp import web

from kura.api.action_cache import MAX_ACTION_RESULT_BYTES, is_ccache_key, parse_action_result
from kura.api.action_lookup import find_action_result, tree_bounds
from kura.api.auth import Access
from kura.api.blob import serve, store
from kura.api.http import (
    count_lookup,
    ctx,
    endpoint,
    read_ref,
    read_small_body,
    reader_of,
    write_ref,
)
from kura.api.partial_content import ranged_response
from kura.core.errors import NotFound
from kura.core.keys import HEX_SHA256, validate
from kura.storage.artifact import ArtifactRef, StoredBody
from kura.storage.ports import one_piece

PROTOCOL = "bazel"


def _ref(request: web.Request, kind: str, *, write: bool = False) -> ArtifactRef:
    digest = validate(request.match_info["digest"], HEX_SHA256, f"{kind} digest")
    return (write_ref if write else read_ref)(request, "bazel", f"{kind}/{digest}")


@endpoint(PROTOCOL, Access.READ)
async def get_ac(request: web.Request) -> web.StreamResponse:
    ref = _ref(request, "ac")
    if is_ccache_key(request.match_info["digest"]):
        return await serve(request, ref, PROTOCOL)
    try:
        manifest, data, _result = await find_action_result(
            reader_of(request), ref, tree_bounds(ctx(request).settings)
        )
    except NotFound:
        count_lookup(request, PROTOCOL, False)
        raise
    count_lookup(request, PROTOCOL, True)
    return await ranged_response(request, StoredBody(manifest, data=data), PROTOCOL)


@endpoint(PROTOCOL, Access.READ)
async def get_cas(request: web.Request) -> web.StreamResponse:
    return await serve(request, _ref(request, "cas"), PROTOCOL)


@endpoint(PROTOCOL, Access.WRITE, body_limit=lambda s: s.max_artifact_bytes)
async def put_ac(request: web.Request) -> web.StreamResponse:
    ref = _ref(request, "ac", write=True)
    c = ctx(request)
    if is_ccache_key(request.match_info["digest"]):
        await store(request, ref, PROTOCOL, limit_bytes=c.settings.max_artifact_bytes)
        return web.Response(status=200)
    limit = min(MAX_ACTION_RESULT_BYTES, c.settings.max_artifact_bytes)
    data = await read_small_body(request, limit, PROTOCOL)
    parse_action_result(data)
    await c.writer.put_stream(
        ref,
        one_piece(data),
        declared_length=len(data),
        limit_bytes=limit,
        content_type=request.headers.get("Content-Type") or "application/octet-stream",
    )
    return web.Response(status=200)


# write:cas: the body must hash to the digest in the path (``expected_sha256``), so the key
# cannot lie about the bytes (kura.core.rights).
@endpoint(PROTOCOL, Access.WRITE_CAS, body_limit=lambda s: s.max_artifact_bytes)
async def put_cas(request: web.Request) -> web.StreamResponse:
    ref = _ref(request, "cas", write=True)
    c = ctx(request)
    if not await c.writer.intact(ref):
        await store(
            request,
            ref,
            PROTOCOL,
            limit_bytes=c.settings.max_artifact_bytes,
            expected_sha256=request.match_info["digest"],
        )
    return web.Response(status=200)


# ccache's ``subdirs`` layout puts a key whose first two characters are "ac" at
# ``{prefix}/ac/<31 characters>`` (about one key in 1,024): only a 64-character name under
# ``ac/`` is Bazel's, and the rest fall through to ``kura.api.http_cache``. Every name under
# ``cas/`` is Bazel's (no ccache or Gradle key has a 3-character first segment).
AC_NAME = "{digest:[^/]{64}}"


def routes(prefix: str) -> list[web.RouteDef]:
    return [
        web.get(prefix + "/ac/" + AC_NAME, get_ac, allow_head=True),
        web.put(prefix + "/ac/" + AC_NAME, put_ac),
        web.get(prefix + "/cas/{digest}", get_cas, allow_head=True),
        web.put(prefix + "/cas/{digest}", put_cas),
    ]
