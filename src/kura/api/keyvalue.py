"""Key-value (action cache) entries: ``PUT /api/cache/keyvalue``, ``GET .../{cas_id}``.

PUT takes JSON ``{"cas_id": str, "entries": [{"value": str}, ...]}`` of at most
``KURA_MAX_KEYVALUE_BYTES`` (413), stores ``{"entries": [...]}`` inline under key
``action_cache/{cas_id}`` and answers 204. Every PUT writes a new version (no existence
short-cut). GET answers the stored JSON or 404 "Key-value entry not found" (upstream Kura).
"""

from __future__ import annotations

import json

from aiohttp import web

from kura.api.auth import Access
from kura.api.http import count_bytes_out, count_lookup, ctx, endpoint, parse_json, read_small_body
from kura.api.scope import namespace_of
from kura.core.errors import InvalidRequest, NotFound
from kura.core.keys import SAFE_NAME, validate
from kura.storage.service import ArtifactRef

PROTOCOL = "keyvalue"


def _ref(request: web.Request, cas_id: str) -> ArtifactRef:
    validate(cas_id, SAFE_NAME, "cas_id")
    return ArtifactRef("xcode", namespace_of(request), f"action_cache/{cas_id}")


@endpoint(PROTOCOL, Access.WRITE, body_limit=lambda s: s.max_keyvalue_bytes)
async def put(request: web.Request) -> web.StreamResponse:
    c = ctx(request)
    namespace_of(request)  # reject a missing tenant before reading the body
    raw = await read_small_body(request, c.settings.max_keyvalue_bytes, PROTOCOL)
    doc = parse_json(raw)
    if not isinstance(doc, dict) or not isinstance(doc.get("cas_id"), str):
        raise InvalidRequest('body must be {"cas_id": string, "entries": [{"value": string}]}')
    entries = doc.get("entries")
    if not isinstance(entries, list) or not all(
        isinstance(e, dict) and isinstance(e.get("value"), str) for e in entries
    ):
        raise InvalidRequest('"entries" must be a list of {"value": string}')
    payload = json.dumps({"entries": entries}, separators=(",", ":")).encode()
    await c.service.put_inline(_ref(request, doc["cas_id"]), payload, "application/json")
    return web.Response(status=204)


@endpoint(PROTOCOL, Access.READ)
async def get(request: web.Request) -> web.StreamResponse:
    ref = _ref(request, request.match_info["cas_id"])
    try:
        body = await ctx(request).service.read(ref)
    except NotFound:
        count_lookup(request, PROTOCOL, False)
        raise NotFound("Key-value entry not found") from None
    count_lookup(request, PROTOCOL, True)
    assert body.data is not None
    count_bytes_out(request, PROTOCOL, len(body.data))
    return web.Response(status=200, body=body.data, content_type="application/json")


def routes() -> list[web.RouteDef]:
    return [
        web.put("/api/cache/keyvalue", put),
        web.get("/api/cache/keyvalue/{cas_id}", get, allow_head=True),
    ]
