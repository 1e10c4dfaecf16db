"""The plain HTTP cache: ``GET``/``HEAD``/``PUT {prefix}/{key...}``.

Used by ccache's HTTP storage (layouts ``subdirs`` ``/XX/rest`` and ``flat``) and Gradle's
``HttpBuildCache`` (``/{32 hex}``): GET answers 200 or 404, PUT stores and answers 201 when new
and 200 when it replaced an entry. Keys are 1-8 path segments of a safe alphabet. ``cas/`` and
``ac/<64 characters>`` under the same prefix belong to ``kura.api.bazel_http``; a ccache
``subdirs`` key that begins with "ac" (``ac/<31 characters>``) is served here. Entries live in namespace
``""``, or under ``/ns/{namespace}{prefix}`` in that namespace (``kura.api.scope``), or in
the credential's overlay (``kura.core.overlay``: ccache and Gradle through the token alone); a
``DELETE`` of the prefix itself cleans it (``kura.api.namespace``).
"""

from __future__ import annotations

from aiohttp import web

from kura.api.auth import Access
from kura.api.blob import serve, store
from kura.api.http import ctx, endpoint, read_ref, write_ref
from kura.core.keys import PATH_KEY, validate

PROTOCOL = "http_cache"


def _key(request: web.Request) -> str:
    return validate(request.match_info["key"], PATH_KEY, "cache key")


@endpoint(PROTOCOL, Access.READ)
async def get(request: web.Request) -> web.StreamResponse:
    return await serve(request, read_ref(request, "http", _key(request)), PROTOCOL)


@endpoint(PROTOCOL, Access.WRITE, body_limit=lambda s: s.max_artifact_bytes)
async def put(request: web.Request) -> web.StreamResponse:
    result = await store(
        request,
        write_ref(request, "http", _key(request)),
        PROTOCOL,
        limit_bytes=ctx(request).settings.max_artifact_bytes,
    )
    return web.Response(status=201 if result.created else 200)


def routes(prefix: str) -> list[web.RouteDef]:
    return [
        web.get(prefix + "/{key:.+}", get, allow_head=True),
        web.put(prefix + "/{key:.+}", put),
    ]
