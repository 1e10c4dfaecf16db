"""Peer-only anti-entropy routes (served by ``api.internal`` under ``/_internal/``, behind the
same peer authentication as every internal route; ``mesh.anti_entropy`` is the client).

* ``GET /_internal/anti_entropy/digests?prefix=<hex>&depth=<0|2>`` →
  ``{"prefix", "depth", "ranges": [[prefix, rows, digest], ...], "tombstones": [count, digest]}``.
  ``prefix`` is 0, 2 or 4 lowercase hex digits, ``depth`` 0 (the range itself) or 2 (its 256
  children), ``len(prefix) + depth`` at most 4. ``ranges`` lists only non-empty ranges, in
  prefix order (one left out is empty); ``digest`` is 16 hex digits
  (``ChangeLog.range_digests``). ``tombstones`` summarises every namespace tombstone. Anything
  else: 400 with a message.
* ``GET /_internal/anti_entropy/range?prefix=<hex>&after=<artifact_id>&limit=<n>`` →
  ``{"manifests": [...], "next_after"}``: the manifests whose artifact_id starts with
  ``prefix`` (0 to 64 hex digits), strictly after ``after`` (a hex artifact_id; absent: from the
  first), in artifact_id order, at most ``limit`` (1 to 1000, default 256); ``next_after`` is
  null on the last page. Cost: one index range scan of at most ``limit + 1`` rows.
"""

from __future__ import annotations

import re

from aiohttp import web

from kura.api.http import ctx, endpoint
from kura.api.query import query_int
from kura.core.errors import InvalidRequest
from kura.mesh.wire import PAGE_LIMIT_DEFAULT, PAGE_LIMIT_MAX
from kura.storage.outbox import DIGEST_DEEPEST, DIGEST_LEVELS
from kura.storage.ports import ChangeLog

PROTOCOL = "internal"
_HEX = re.compile(r"[0-9a-f]{0,64}")


def _hex(request: web.Request, name: str, max_len: int) -> str:
    value = request.query.get(name, "")
    if not _HEX.fullmatch(value) or len(value) > max_len:
        raise InvalidRequest(f"{name} must be at most {max_len} lowercase hex digits")
    return value


def _just_before(prefix: str) -> str:
    """The greatest cursor below every hex id that starts with ``prefix`` ("" for no prefix).

    Pages are strictly after their cursor, so the cursor must not be ``prefix`` itself: a
    64-digit prefix is a whole id, and would be left out of its own range. Hex digits sort
    below ``g``, so ``...<digit - 1>g`` sorts after every id of the previous digit.
    """
    if not prefix:
        return ""
    head, last = prefix[:-1], prefix[-1]
    if last == "0":
        return head
    previous = "0123456789abcdef"["0123456789abcdef".index(last) - 1]
    return head + previous + "g"


@endpoint(PROTOCOL, None)
async def range_digests(request: web.Request) -> web.StreamResponse:
    prefix = _hex(request, "prefix", DIGEST_DEEPEST)
    depth = query_int(request, "depth", default=0, low=0, high=2)
    if len(prefix) not in DIGEST_LEVELS or depth not in (0, 2):
        raise InvalidRequest("prefix must have 0, 2 or 4 hex digits and depth must be 0 or 2")
    if len(prefix) + depth > DIGEST_DEEPEST:
        raise InvalidRequest(f"prefix length + depth must be at most {DIGEST_DEEPEST}")
    replica_log: ChangeLog = ctx(request).peer_pages().replica_log
    found = await replica_log.range_digests(prefix, depth)
    return web.json_response(
        {
            "prefix": prefix,
            "depth": depth,
            "ranges": [list(r) for r in found.ranges],
            "tombstones": list(found.tombstones),
        }
    )


@endpoint(PROTOCOL, None)
async def range_manifests(request: web.Request) -> web.StreamResponse:
    prefix = _hex(request, "prefix", 64)
    after = request.query.get("after")
    if after is not None and not re.fullmatch(r"[0-9a-f]{1,64}", after):
        raise InvalidRequest("after must be a lowercase hex artifact_id")
    limit = query_int(request, "limit", default=PAGE_LIMIT_DEFAULT, low=1, high=PAGE_LIMIT_MAX)
    start = after if after is not None and after >= _just_before(prefix) else _just_before(prefix)
    page = await ctx(request).peer_pages().manifests_page(start or None, limit + 1)
    page = [m for m in page if m.artifact_id.startswith(prefix)]
    more = len(page) > limit
    page = page[:limit]
    return web.json_response(
        {
            "manifests": [m.to_json() for m in page],
            "next_after": page[-1].artifact_id if more else None,
        }
    )


def routes() -> list[web.RouteDef]:
    return [
        web.get("/_internal/anti_entropy/digests", range_digests),
        web.get("/_internal/anti_entropy/range", range_manifests),
    ]
