"""Namespace clean: a tombstone that deletes every artifact of a namespace, on every node.

Two ways in, one effect (``ArtifactWriter.delete_namespace``), each answering 204 and needing the
right ``clean`` (403 without it, ``kura.core.rights``):

* ``DELETE /api/cache/clean?tenant_id=&namespace_id=`` (Kura's route; no ``namespace_id``
  is the tenant-wide namespace ``""``, or a credential's overlay's write namespace: a clean
  goes where the request writes, ``kura.core.overlay``, never to a namespace it only reads);
* ``DELETE`` on the root of the Bazel/HTTP-cache and WebDAV routes, whose clients cannot send a
  query: ``{KURA_HTTP_CACHE_PREFIX}`` and ``{KURA_WEBDAV_PREFIX}`` clean namespace ``""``,
  ``/ns/{namespace}{prefix}`` (``kura.api.scope.NAMESPACED_PREFIX``) cleans that namespace. A
  ``DELETE`` of a WebDAV collection removes everything in it (RFC 4918 §9.6.1,
  https://www.rfc-editor.org/rfc/rfc4918#section-9.6.1).

A namespace is one set, whatever route wrote into it: cleaning ``""`` also drops what Kura's
routes stored without a ``namespace_id``, and cleaning ``team1`` drops the Turborepo team
``team1`` and Kura's ``namespace_id=team1`` too. The tombstone's version blocks any older copy
that arrives later (replication, bootstrap, anti-entropy), so a clean cannot be undone by a late
write (kura-behaviour.md §2.6), and it is shipped to every peer like a write.
"""

from __future__ import annotations

from aiohttp import web

from kura.api.auth import Access
from kura.api.http import ctx, endpoint, namespaces
from kura.api.scope import check_tenant

PROTOCOL = "namespace"


@endpoint(PROTOCOL, Access.CLEAN)
async def clean(request: web.Request) -> web.StreamResponse:
    check_tenant(request)
    await ctx(request).writer.delete_namespace(namespaces(request).writable)
    return web.Response(status=204)


@endpoint(PROTOCOL, Access.CLEAN)
async def clean_route_root(request: web.Request) -> web.StreamResponse:
    """``DELETE`` on a route root: clean the namespace its path names (``""`` without one)."""
    await ctx(request).writer.delete_namespace(namespaces(request).writable)
    return web.Response(status=204)


def routes() -> list[web.RouteDef]:
    return [web.delete("/api/cache/clean", clean)]


def root_routes(prefix: str) -> list[web.RouteDef]:
    """``DELETE prefix`` and ``DELETE prefix/`` clean the namespace of the routes under it."""
    return [web.delete(prefix, clean_route_root), web.delete(prefix + "/", clean_route_root)]
