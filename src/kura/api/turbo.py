"""Turborepo remote cache API v8 (``/v8/artifacts/...``).

What turbo 2.11 sends (clients.md): ``GET /v8/artifacts/status``; ``GET``/``PUT``
``/v8/artifacts/{hash}?slug=`` (or ``teamId=``); ``POST /v8/artifacts/events``. The PUT carries
``x-artifact-duration`` and, with signing on, ``x-artifact-tag``; both are stored with the body
and returned on GET, because turbo treats a signed artifact without its tag as a miss. The team
(``teamId`` or ``slug``) is the namespace; a request without either is 400, like
turborepo-remote-cache, unless its credential has an overlay (``kura.core.overlay``: then the
overlay's namespaces, and a team must be one of them). ``POST /v8/artifacts`` answers which of a list of hashes exist. Errors
carry the Vercel ``{"error": {"code", "message"}}`` shape (``kura.api.errors``), which turbo
parses on a 403 such as a read-only token's upload.
"""

from __future__ import annotations

from aiohttp import web

from kura.api.auth import Access
from kura.api.blob import serve, store
from kura.api.http import (
    ctx,
    endpoint,
    parse_json,
    read_ref,
    read_small_body,
    reader_of,
    write_ref,
)
from kura.core.errors import InvalidRequest
from kura.core.keys import ALNUM_HASH, validate
from kura.core.manifest import stored_header_problem

PROTOCOL = "turbo"
STORED_HEADERS = ("x-artifact-tag", "x-artifact-duration")
SMALL_BODY_LIMIT_BYTES = 1024 * 1024


def _key(request: web.Request, hash_: str | None = None) -> str:
    return validate(hash_ or request.match_info["hash"], ALNUM_HASH, "artifact hash")


@endpoint(PROTOCOL, Access.READ, style="vercel")
async def status(request: web.Request) -> web.StreamResponse:
    return web.json_response({"status": "enabled"})


@endpoint(PROTOCOL, Access.READ, style="vercel")
async def get(request: web.Request) -> web.StreamResponse:
    ref = read_ref(request, "turbo", _key(request))
    return await serve(request, ref, PROTOCOL, headers_from_manifest=STORED_HEADERS)


@endpoint(PROTOCOL, Access.WRITE, style="vercel", body_limit=lambda s: s.max_artifact_bytes)
async def put(request: web.Request) -> web.StreamResponse:
    ref = write_ref(request, "turbo", _key(request))
    headers = {}
    for name in STORED_HEADERS:
        value = request.headers.get(name)
        if value is not None:
            problem = stored_header_problem(name, value)
            if problem is not None:
                raise InvalidRequest(problem)
            if name == "x-artifact-duration" and not (value.isdigit() and len(value) <= 15):
                raise InvalidRequest("x-artifact-duration must be a whole number of milliseconds")
            headers[name] = value
    await store(
        request,
        ref,
        PROTOCOL,
        limit_bytes=ctx(request).settings.max_artifact_bytes,
        content_type="application/octet-stream",
        headers=headers,
    )
    return web.json_response({"urls": [f"{request.path}"]}, status=202)


@endpoint(PROTOCOL, Access.READ, style="vercel")
async def events(request: web.Request) -> web.StreamResponse:
    raw = await read_small_body(request, SMALL_BODY_LIMIT_BYTES, PROTOCOL)
    parse_json(raw or b"[]")
    return web.Response(status=200)


@endpoint(PROTOCOL, Access.READ, style="vercel")
async def query(request: web.Request) -> web.StreamResponse:
    raw = await read_small_body(request, SMALL_BODY_LIMIT_BYTES, PROTOCOL)
    doc = parse_json(raw)
    hashes = doc.get("hashes") if isinstance(doc, dict) else None
    if not isinstance(hashes, list) or not all(isinstance(h, str) for h in hashes):
        raise InvalidRequest('body must be {"hashes": [string, ...]}')
    service = reader_of(request)
    answer: dict[str, object] = {}
    for h in hashes[:1000]:
        manifest = await service.read_manifest(
            service.artifact_id(read_ref(request, "turbo", _key(request, h)))
        )
        if manifest is None:
            answer[h] = {"error": {"message": "Artifact not found"}}
        else:
            answer[h] = {
                "size": manifest.size,
                "taskDurationMs": _duration_ms(manifest.headers.get("x-artifact-duration")),
                "tag": manifest.headers.get("x-artifact-tag"),
            }
    return web.json_response(answer)


def _duration_ms(value: str | None) -> int:
    """A stored ``x-artifact-duration`` as an integer (0 when absent or not an integer)."""
    return int(value) if value is not None and value.isdigit() and len(value) <= 15 else 0


def routes() -> list[web.RouteDef]:
    return [
        web.get("/v8/artifacts/status", status),
        web.post("/v8/artifacts/events", events),
        web.post("/v8/artifacts", query),
        web.get("/v8/artifacts/{hash}", get, allow_head=True),
        web.put("/v8/artifacts/{hash}", put),
    ]
