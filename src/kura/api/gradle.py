"""Gradle build cache on Kura's route: ``PUT``/``GET /api/cache/gradle/{cache_key}``.

PUT answers 201 when stored and 200 when the entry already existed intact (the body is then not
read; a damaged stored copy is quarantined and the body stored),
like the Rust Kura monorepo. Bodies are limited by ``KURA_MAX_GRADLE_BYTES``. Gradle's stock
``HttpBuildCache`` cannot add ``tenant_id`` to its URLs; point it at the plain HTTP cache
(``kura.api.http_cache``) instead.
"""

from __future__ import annotations

from aiohttp import web

from kura.api.auth import Access
from kura.api.blob import serve, store
from kura.api.http import ctx, endpoint, read_ref, write_ref
from kura.api.scope import check_tenant
from kura.core.keys import SAFE_NAME, validate

PROTOCOL = "gradle"


def _key(request: web.Request) -> str:
    key = validate(request.match_info["cache_key"], SAFE_NAME, "Gradle cache key")
    check_tenant(request)
    return key


@endpoint(PROTOCOL, Access.READ)
async def get(request: web.Request) -> web.StreamResponse:
    return await serve(request, read_ref(request, "gradle", _key(request)), PROTOCOL)


@endpoint(PROTOCOL, Access.WRITE, body_limit=lambda s: s.max_gradle_bytes)
async def put(request: web.Request) -> web.StreamResponse:
    ref = write_ref(request, "gradle", _key(request))
    c = ctx(request)
    if await c.writer.intact(ref):  # a damaged copy is quarantined and replaced
        return web.Response(status=200)
    await store(request, ref, PROTOCOL, limit_bytes=c.settings.max_gradle_bytes)
    return web.Response(status=201)


def routes() -> list[web.RouteDef]:
    return [
        web.get("/api/cache/gradle/{cache_key}", get, allow_head=True),
        web.put("/api/cache/gradle/{cache_key}", put),
    ]
