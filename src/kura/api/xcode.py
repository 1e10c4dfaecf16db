"""Xcode compilation cache CAS: ``POST``/``GET /api/cache/cas/{id}`` (Kura's own route).

POST answers 204, also when the artifact already exists intact, in which case the body is not
read (upstream's early existence check; a damaged stored copy is quarantined and replaced). Bodies are limited by ``KURA_MAX_XCODE_BYTES``.
Keys are stored as ``blob/{id}`` like upstream.
"""

from __future__ import annotations

from aiohttp import web

from kura.api.auth import Access
from kura.api.blob import serve, store
from kura.api.http import ctx, endpoint, read_ref, write_ref
from kura.api.scope import check_tenant
from kura.core.keys import SAFE_NAME, validate

PROTOCOL = "xcode"


def _key(request: web.Request) -> str:
    cas_id = validate(request.match_info["id"], SAFE_NAME, "CAS id")
    check_tenant(request)
    return f"blob/{cas_id}"


@endpoint(PROTOCOL, Access.READ)
async def get(request: web.Request) -> web.StreamResponse:
    return await serve(request, read_ref(request, "xcode", _key(request)), PROTOCOL)


# write, not write:cas: the id is Xcode's own (its CAS hashes with its own function and
# encoding), kura stores the body under it unchecked, so the key could name any bytes.
@endpoint(PROTOCOL, Access.WRITE, body_limit=lambda s: s.max_xcode_bytes)
async def post(request: web.Request) -> web.StreamResponse:
    ref = write_ref(request, "xcode", _key(request))
    c = ctx(request)
    if not await c.writer.intact(ref):
        await store(request, ref, PROTOCOL, limit_bytes=c.settings.max_xcode_bytes)
    return web.Response(status=204)


def routes() -> list[web.RouteDef]:
    return [
        web.get("/api/cache/cas/{id}", get, allow_head=True),
        web.post("/api/cache/cas/{id}", post),
    ]
