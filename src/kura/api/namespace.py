"""Namespace clean: ``DELETE /api/cache/clean`` writes a tombstone and deletes the namespace.

Answers 204. The tombstone's version blocks any older copy that arrives later (replication,
bootstrap), so a clean cannot be undone by a late write (kura-behaviour.md §2.6).
"""

from __future__ import annotations

from aiohttp import web

from kura.api.auth import Access
from kura.api.http import ctx, endpoint
from kura.api.scope import namespace_of

PROTOCOL = "namespace"


@endpoint(PROTOCOL, Access.WRITE)
async def clean(request: web.Request) -> web.StreamResponse:
    await ctx(request).service.delete_namespace(namespace_of(request))
    return web.Response(status=204)


def routes() -> list[web.RouteDef]:
    return [web.delete("/api/cache/clean", clean)]
