"""Key-value (action cache) entries: ``PUT /api/cache/keyvalue``, ``GET .../{cas_id}``.

PUT takes JSON ``{"cas_id": str, "entries": [{"value": str}, ...]}`` of at most
``KURA_MAX_KEYVALUE_BYTES`` (413), stores ``{"entries": [...]}`` inline under key
``action_cache/{cas_id}`` and answers 204. Every PUT writes a new version (no existence
short-cut). GET answers the stored JSON or 404 "Key-value entry not found" (upstream Kura).

References must resolve. Upstream Kura stores the entries opaquely
(https://github.com/tuist/kura, ``src/http.rs`` ``put_keyvalue``/``get_keyvalue``); what a
``value`` holds is the client's business. Tuist's Xcode cache client
(https://github.com/tuist/tuist, ``cli/Sources/TuistCAS/Services/KeyValueService.swift``) sends
each ``value`` as standard base64 of the bytes of Xcode's KeyValueDB value, a compile-job
result; the CAS objects it points at appear in it as a 65-byte length-delimited field 1
(``0x0A 0x41``) holding ``0x00`` and the object's 64-hex-digit id, which is the id the client
saved the object under (``POST /api/cache/cas/{id}``, stored as ``blob/{id}`` in the same
namespace; ``kura.api.xcode``). So a GET is a hit only while every such id is stored, its file
in place (``ArtifactReader.missing``, the Bazel action cache's check: an object evicted, or whose
file was removed behind the node's back, field report B29), else it is the same 404 as a missing
entry (counted as a miss). A value that is not base64, or holds no
such field, references nothing and is served as stored.
"""

from __future__ import annotations

import base64
import binascii
import json
import re

from aiohttp import web

from kura.api.auth import Access
from kura.api.http import (
    count_bytes_out,
    count_lookup,
    ctx,
    endpoint,
    parse_json,
    read_ref,
    read_small_body,
    reader_of,
    write_ref,
)
from kura.api.scope import check_tenant
from kura.core.errors import InvalidRequest, NotFound
from kura.core.keys import SAFE_NAME, validate
from kura.storage.artifact import ArtifactRef
from kura.storage.overlay import each_namespace

PROTOCOL = "keyvalue"
# 0x0A 0x41 0x00 then the 64 hex digits of a CAS id (module docstring).
_CAS_REFERENCE = re.compile(rb"\x0a\x41\x00([0-9A-Fa-f]{64})")


def referenced_cas_ids(entries: object) -> list[str]:
    """The CAS ids the stored ``entries`` (a list of ``{"value": str}``) reference, in order,
    without repeats; empty when none can be found (module docstring)."""
    ids: dict[str, None] = {}
    for entry in entries if isinstance(entries, list) else ():
        value = entry.get("value") if isinstance(entry, dict) else None
        if not isinstance(value, str):
            continue
        try:
            raw = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            continue
        for match in _CAS_REFERENCE.finditer(raw):
            ids[match.group(1).decode("ascii")] = None
    return list(ids)


def _key(request: web.Request, cas_id: str) -> str:
    check_tenant(request)
    return f"action_cache/{validate(cas_id, SAFE_NAME, 'cas_id')}"


@endpoint(PROTOCOL, Access.WRITE, body_limit=lambda s: s.max_keyvalue_bytes)
async def put(request: web.Request) -> web.StreamResponse:
    c = ctx(request)
    check_tenant(request)  # reject a missing tenant before reading the body
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
    ref = write_ref(request, "xcode", _key(request, doc["cas_id"]))
    await c.writer.put_inline(ref, payload, "application/json")
    return web.Response(status=204)


@endpoint(PROTOCOL, Access.READ)
async def get(request: web.Request) -> web.StreamResponse:
    ref = read_ref(request, "xcode", _key(request, request.match_info["cas_id"]))
    service = reader_of(request)
    # An entry whose objects are gone in an earlier namespace does not hide a whole one in a
    # later namespace (``storage.overlay.each_namespace``).
    for each in each_namespace(service, ref):
        try:
            body = await service.read(each)
            assert body.data is not None
            ids = referenced_cas_ids(_entries(body.data))
            if ids and await service.missing(
                [ArtifactRef("xcode", each.namespace_id, f"blob/{i}") for i in ids]
            ):
                raise NotFound("a referenced CAS object is gone")
            break
        except NotFound:
            continue
    else:
        count_lookup(request, PROTOCOL, False)
        raise NotFound("Key-value entry not found")
    count_lookup(request, PROTOCOL, True)
    count_bytes_out(request, PROTOCOL, len(body.data))
    return web.Response(status=200, body=body.data, content_type="application/json")


def _entries(stored: bytes) -> object:
    try:
        doc = json.loads(stored)
    except ValueError:
        return None
    return doc.get("entries") if isinstance(doc, dict) else None


def routes() -> list[web.RouteDef]:
    return [
        web.put("/api/cache/keyvalue", put),
        web.get("/api/cache/keyvalue/{cas_id}", get, allow_head=True),
    ]
