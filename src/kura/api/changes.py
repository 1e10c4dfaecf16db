"""``GET /_internal/changes?since=<seq>&limit=<n>``: this node's change feed (issue 11,
deliverable 2), a peer-only route like every ``/_internal/`` one (``kura.api.internal``).

Answers ``{"epoch", "tombstones": [{"namespace_id", "version_ms"}], "manifests": [manifest],
"next_since", "head_seq", "more"}``: the tombstones and manifests whose change number is above
``since``, in change order, at most ``limit`` rows together (``storage.change_feed``). A puller
applies a page's tombstones before its manifests, then asks again from ``next_since`` while
``more``. A cursor is only meaningful in its ``epoch``; a ``since`` above ``head_seq`` is one
from another history (a restored backup), which the puller treats like another epoch.

``since`` is required, an integer >= 0; ``limit`` 1..``PAGE_LIMIT_MAX`` (default
``PAGE_LIMIT_DEFAULT``): anything else is 400 with a message. A requester naming itself in
``Kura-Node`` is reported to ``FEED_READ_KEY``'s callback (the catch-up marks, ``mesh.catch_up``).

``POST /_internal/changes/pull`` with ``Kura-Node: <peer URL>``: that peer marked this node to be
caught up and asks it to pull the peer's feed now (``PULL_KEY``'s callback starts the pass,
``mesh.bootstrap``). 204; 404 when the named node is not one of this node's peers; 400 without
``Kura-Node``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from kura.api.http import ctx, endpoint
from kura.api.query import query_int
from kura.core.errors import InvalidRequest, NotFound
from kura.mesh.wire import NODE_HEADER, PAGE_LIMIT_DEFAULT, PAGE_LIMIT_MAX
from kura.storage.outbox import ChangesPage

PROTOCOL = "internal"
# Called with the requester's URL before the page is read; what it returns, after.
FeedRead = Callable[[str], Callable[[int, ChangesPage], Awaitable[None]]]
FEED_READ_KEY: web.AppKey[FeedRead] = web.AppKey("kura_feed_read")
# Called with the asking peer's URL; False when it is not a peer this node pulls from.
PULL_KEY: web.AppKey[Callable[[str], bool]] = web.AppKey("kura_pull")


@endpoint(PROTOCOL, None)
async def changes(request: web.Request) -> web.StreamResponse:
    since = query_int(request, "since", default=None, low=0, high=2**63 - 1)
    limit = query_int(request, "limit", default=PAGE_LIMIT_DEFAULT, low=1, high=PAGE_LIMIT_MAX)
    requester = request.headers.get(NODE_HEADER, "")
    feed_read = request.app.get(FEED_READ_KEY)
    done = feed_read(requester) if requester and feed_read is not None else None
    page = await ctx(request).peer_pages().replica_log.changes_page(since, limit)
    if done is not None:
        await done(since, page)
    return web.json_response(
        {
            "epoch": page.epoch,
            "tombstones": [{"namespace_id": n, "version_ms": v} for n, v in page.tombstones],
            "manifests": [m.to_json() for m in page.manifests],
            "next_since": page.next_since,
            "head_seq": page.head_seq,
            "more": page.more,
        }
    )


@endpoint(PROTOCOL, None)
async def pull(request: web.Request) -> web.StreamResponse:
    peer = request.headers.get(NODE_HEADER, "")
    if not peer:
        raise InvalidRequest(f"{NODE_HEADER} must name the node whose feed to pull")
    pull_now = request.app.get(PULL_KEY)
    if pull_now is None or not pull_now(peer):
        raise NotFound(f"{peer} is not a peer this node pulls from")
    return web.Response(status=204)


def routes() -> list[web.RouteDef]:
    return [web.get("/_internal/changes", changes), web.post("/_internal/changes/pull", pull)]
