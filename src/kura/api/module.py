"""Multipart module uploads: ``POST /api/cache/module/start|part|complete`` and
``HEAD``/``GET /api/cache/module/{id}``.

Statuses follow upstream Kura (kura-behaviour.md §1.3): start → 200 ``{"upload_id": ...}`` (null
if the module exists); part → 204 (400 bad part number, 413 over 10 MiB, 404 unknown upload,
422 total over 2 GiB); complete → 204 (400 parts mismatch, 404, 422); HEAD → 204 or 404. The key
is ``{cache_category}/{hash}/{name}`` from the query; the ``{id}`` path segment is ignored.
A part or a completion is authorised against the namespace of the upload it names
(``_upload_namespace``).
"""

from __future__ import annotations

from aiohttp import web

from kura.api.auth import Access
from kura.api.blob import serve
from kura.api.http import (
    count_lookup,
    ctx,
    declared_length,
    endpoint,
    parse_json,
    read_ref,
    read_small_body,
    reader_of,
    request_body,
    write_ref,
)
from kura.api.query import query_int
from kura.api.scope import check_tenant
from kura.core.errors import InvalidRequest, NotFound
from kura.core.keys import SAFE_NAME, validate
from kura.storage.artifact import ArtifactRef
from kura.storage.multipart import MAX_PART_BYTES

PROTOCOL = "module"
COMPLETE_BODY_LIMIT_BYTES = 1024 * 1024


def _ref(request: web.Request, *, write: bool = False) -> ArtifactRef:
    check_tenant(request)
    fields = {}
    for name in ("hash", "name"):
        value = request.query.get(name)
        if not value:
            raise InvalidRequest(f"Missing {name}")
        fields[name] = validate(value, SAFE_NAME, name)
    category = validate(
        request.query.get("cache_category") or "builds", SAFE_NAME, "cache_category"
    )
    key = f"{category}/{fields['hash']}/{fields['name']}"
    return (write_ref if write else read_ref)(request, "module", key)


@endpoint(PROTOCOL, Access.WRITE)
async def start(request: web.Request) -> web.StreamResponse:
    upload_id = await ctx(request).uploads.start(_ref(request, write=True))
    return web.json_response({"upload_id": upload_id})


def _upload_id(request: web.Request) -> str:
    upload_id = request.query.get("upload_id")
    if not upload_id:
        raise InvalidRequest("Missing upload_id")
    return upload_id


def _upload_namespace(request: web.Request) -> str | None:
    """The namespace of the upload a part or completion names (the one its ``start`` named),
    not the one this request's query names: a token limited to namespace B is refused (403)
    parts and completion of namespace A's upload, whatever its query says, and so is an
    overlay credential for a namespace it does not write. None for an unknown upload: the
    handler answers 404, after the checks made before ``100 Continue`` (a body too large is
    413 first). ``InvalidRequest`` without an ``upload_id``."""
    try:
        return ctx(request).uploads.namespace_of(_upload_id(request))
    except NotFound:
        return None


@endpoint(PROTOCOL, Access.WRITE, body_limit=lambda _s: MAX_PART_BYTES, namespace=_upload_namespace)
async def part(request: web.Request) -> web.StreamResponse:
    upload_id = _upload_id(request)
    number = query_int(request, "part_number", default=None, low=0, high=2**31 - 1)
    await ctx(request).uploads.put_part(
        upload_id, number, request_body(request, PROTOCOL), declared_length(request)
    )
    return web.Response(status=204)


@endpoint(PROTOCOL, Access.WRITE, namespace=_upload_namespace)
async def complete(request: web.Request) -> web.StreamResponse:
    upload_id = _upload_id(request)
    raw = await read_small_body(request, COMPLETE_BODY_LIMIT_BYTES, PROTOCOL)
    doc = parse_json(raw)
    parts = doc.get("parts") if isinstance(doc, dict) else None
    if not isinstance(parts, list) or not all(
        isinstance(p, int) and not isinstance(p, bool) for p in parts
    ):
        raise InvalidRequest('body must be {"parts": [1, 2, ...]}')
    await ctx(request).uploads.complete(upload_id, parts)
    return web.Response(status=204)


@endpoint(PROTOCOL, Access.READ)
async def head(request: web.Request) -> web.StreamResponse:
    exists = await reader_of(request).exists(_ref(request))
    count_lookup(request, PROTOCOL, exists)
    if not exists:
        raise NotFound("Artifact not found")
    return web.Response(status=204)


@endpoint(PROTOCOL, Access.READ)
async def get(request: web.Request) -> web.StreamResponse:
    return await serve(request, _ref(request), PROTOCOL)


def routes() -> list[web.RouteDef]:
    return [
        web.post("/api/cache/module/start", start),
        web.post("/api/cache/module/part", part),
        web.post("/api/cache/module/complete", complete),
        web.head("/api/cache/module/{id}", head),
        web.get("/api/cache/module/{id}", get, allow_head=False),
    ]
