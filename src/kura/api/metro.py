"""Metro ``HttpStore``: ``GET``/``PUT /api/metro/cache/{key}``.

metro-cache 0.87 (clients.md) PUTs a gzip body with ``Transfer-Encoding: chunked`` and no
Content-Type, and expects the exact bytes back with no ``Content-Encoding``. 404 is a miss; any
2xx on PUT is success (upstream Kura answers 200). Fixed namespace ``metro``.
"""

from __future__ import annotations

from aiohttp import web

from kura.api.auth import Access
from kura.api.blob import serve, store
from kura.api.http import ctx, endpoint, read_ref, write_ref
from kura.core.keys import SAFE_NAME, validate

PROTOCOL = "metro"


def _key(request: web.Request) -> str:
    return validate(request.match_info["key"], SAFE_NAME, "Metro key")


@endpoint(PROTOCOL, Access.READ)
async def get(request: web.Request) -> web.StreamResponse:
    return await serve(request, read_ref(request, "metro", _key(request)), PROTOCOL)


@endpoint(PROTOCOL, Access.WRITE, body_limit=lambda s: s.max_artifact_bytes)
async def put(request: web.Request) -> web.StreamResponse:
    await store(
        request,
        write_ref(request, "metro", _key(request)),
        PROTOCOL,
        limit_bytes=ctx(request).settings.max_artifact_bytes,
        content_type="application/octet-stream",
    )
    return web.Response(status=200)


def routes() -> list[web.RouteDef]:
    return [
        web.get("/api/metro/cache/{key}", get, allow_head=True),
        web.put("/api/metro/cache/{key}", put),
    ]
