"""Nx self-hosted remote cache: ``GET``/``PUT /v1/cache/{hash}``.

Nx 24 (clients.md): GET answers 200 with the tar.gz or 404 for a miss. PUT must answer 200 (a
201 or 204 makes Nx retry and then fail the run); 409 and 403 are accepted as "skip". A 401 must
be ``text/plain`` or Nx reports a misconfigured endpoint. Artifacts live in the fixed namespace
``nx`` like upstream Kura, or in the namespaces of the credential's overlay
(``kura.core.overlay``: Nx cannot name one itself). The hash is Nx's decimal u64 but any short alphanumeric id is taken.
"""

from __future__ import annotations

from aiohttp import web

from kura.api.auth import Access
from kura.api.blob import serve, store
from kura.api.http import ctx, endpoint, read_ref, write_ref
from kura.core.keys import ALNUM_HASH, validate

PROTOCOL = "nx"


def _key(request: web.Request) -> str:
    return validate(request.match_info["hash"], ALNUM_HASH, "Nx hash")


@endpoint(PROTOCOL, Access.READ, style="text")
async def get(request: web.Request) -> web.StreamResponse:
    return await serve(request, read_ref(request, "nx", _key(request)), PROTOCOL)


@endpoint(PROTOCOL, Access.WRITE, style="text", body_limit=lambda s: s.max_artifact_bytes)
async def put(request: web.Request) -> web.StreamResponse:
    ref = write_ref(request, "nx", _key(request))
    if not await ctx(request).writer.intact(ref):  # a damaged copy is replaced
        await store(request, ref, PROTOCOL, limit_bytes=ctx(request).settings.max_artifact_bytes)
    return web.Response(status=200, text="ok", content_type="text/plain")


def routes() -> list[web.RouteDef]:
    return [
        web.get("/v1/cache/{hash}", get, allow_head=True),
        web.put("/v1/cache/{hash}", put),
    ]
