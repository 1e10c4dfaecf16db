"""The two operations most protocols share: serve a stored blob, store a request body."""

from __future__ import annotations

from aiohttp import web

from kura.api.http import count_lookup, ctx, declared_length, reader_of, request_body
from kura.api.partial_content import ranged_response
from kura.core.errors import NotFound
from kura.core.manifest import stored_header_problem
from kura.storage.artifact import ArtifactRef, PutResult


async def serve(
    request: web.Request,
    ref: ArtifactRef,
    protocol: str,
    *,
    headers_from_manifest: tuple[str, ...] = (),
) -> web.StreamResponse:
    """200 with the artifact (GET or HEAD), 206 or 416 for a ``Range`` request
    (``kura.api.partial_content``), or raise NotFound. Counts a hit or a miss. ``ref`` is
    looked up through the request's namespaces in order (``kura.api.http.reader_of``)."""
    try:
        body = await reader_of(request).read(ref)
    except NotFound:
        count_lookup(request, protocol, False)
        raise
    count_lookup(request, protocol, True)
    stored = body.manifest.headers
    # Defence in depth: a value stored before the rule existed is left out, not sent (a CR or
    # LF in it would make aiohttp drop the connection without an answer).
    extra = (
        {
            h: stored[h]
            for h in headers_from_manifest
            if h in stored and stored_header_problem(h, stored[h]) is None
        }
        if headers_from_manifest
        else None
    )
    return await ranged_response(request, body, protocol, extra_headers=extra)


async def store(
    request: web.Request,
    ref: ArtifactRef,
    protocol: str,
    *,
    limit_bytes: int,
    content_type: str | None = None,
    headers: dict[str, str] | None = None,
    expected_sha256: str | None = None,
) -> PutResult:
    """Stream the request body into storage as a new version of ``ref``."""
    c = ctx(request)
    return await c.writer.put_stream(
        ref,
        request_body(request, protocol),
        declared_length=declared_length(request),
        limit_bytes=limit_bytes,
        content_type=content_type
        or request.headers.get("Content-Type")
        or "application/octet-stream",
        headers=headers,
        expected_sha256=expected_sha256,
    )
