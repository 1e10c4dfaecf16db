"""Bazel's HTTP remote cache: ``{prefix}/ac/{sha256}`` and ``{prefix}/cas/{sha256}``.

Bazel 4 (clients.md) GETs ``ac/`` (404 is a miss), PUTs its outputs to ``cas/`` and then the
ActionResult to ``ac/``. A ``cas/`` body must hash to the digest in its path (400 otherwise, and
nothing is stored); a ``cas/`` entry that is already stored and intact is not re-read (a damaged
one is quarantined and replaced by the new body). ccache's ``bazel``
layout uses ``ac/`` with its own keys padded to 64 hex digits, which is why ``ac/`` bodies are
not checked. ``{prefix}`` is ``KURA_HTTP_CACHE_PREFIX`` (default ``/cache``).
"""

from __future__ import annotations

from aiohttp import web

from kura.api.auth import Access
from kura.api.blob import serve, store
from kura.api.http import ctx, endpoint
from kura.core.keys import HEX_SHA256, validate
from kura.storage.service import ArtifactRef

PROTOCOL = "bazel"


def _ref(request: web.Request, kind: str) -> ArtifactRef:
    digest = validate(request.match_info["digest"], HEX_SHA256, f"{kind} digest")
    return ArtifactRef("bazel", "", f"{kind}/{digest}")


@endpoint(PROTOCOL, Access.READ)
async def get_ac(request: web.Request) -> web.StreamResponse:
    return await serve(request, _ref(request, "ac"), PROTOCOL)


@endpoint(PROTOCOL, Access.READ)
async def get_cas(request: web.Request) -> web.StreamResponse:
    return await serve(request, _ref(request, "cas"), PROTOCOL)


@endpoint(PROTOCOL, Access.WRITE)
async def put_ac(request: web.Request) -> web.StreamResponse:
    await store(
        request, _ref(request, "ac"), PROTOCOL, limit_bytes=ctx(request).settings.max_artifact_bytes
    )
    return web.Response(status=200)


@endpoint(PROTOCOL, Access.WRITE)
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


def routes(prefix: str) -> list[web.RouteDef]:
    return [
        web.get(prefix + "/ac/{digest}", get_ac, allow_head=True),
        web.put(prefix + "/ac/{digest}", put_ac),
        web.get(prefix + "/cas/{digest}", get_cas, allow_head=True),
        web.put(prefix + "/cas/{digest}", put_cas),
    ]
