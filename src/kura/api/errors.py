"""The one table from kura's exception tree to HTTP status codes, and the error body.

Bodies are JSON ``{"message": "..."}`` like the Rust Kura server (kura-behaviour.md §1.2).
Exceptions from clients that answer text ask for ``text`` style: Content-Type exactly
``text/plain``, no parameters, because Nx treats only such a 401 as "Unauthorized" (clients.md;
Nx 24 compares the header byte for byte). Turborepo's routes ask for ``vercel`` style: the same
JSON plus the Vercel API's ``{"error": {"code", "message"}}``, because turbo 2 parses every 403
body as that shape (a read-only token's refused upload otherwise shows as "failed to contact
remote cache: unable to parse ... missing field `error`"). 503s carry ``Retry-After``.
"""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Literal

from aiohttp import web

from kura.core import errors as e
from kura.core.version import FutureVersion
from kura.mesh.wire import FUTURE_VERSION, REFUSAL_HEADER

ErrorStyle = Literal["json", "text", "vercel"]

STATUS: tuple[tuple[type[e.KuraError], int], ...] = (
    (e.Unauthenticated, 401),
    (e.Forbidden, 403),
    (e.NotFound, 404),
    (e.Conflict, 409),
    (e.PayloadTooLarge, 413),
    (e.UnsupportedContentCoding, 415),
    (e.UnprocessableEntity, 422),
    (e.InsufficientStorage, 507),
    (e.InvalidRequest, 400),  # after its subclasses DigestMismatch and IncompleteBody
    (e.ResourceExhausted, 503),
    (e.Unavailable, 503),
    (e.Corruption, 500),
    (e.UnsupportedTransferCoding, 501),
)


def status_for(exc: e.KuraError) -> int:
    for cls, status in STATUS:
        if isinstance(exc, cls):
            return status
    return 500


def error_response(exc: e.KuraError, style: ErrorStyle = "json") -> web.Response:
    """The response for ``exc``: status from the table, message body, Retry-After when due."""
    status = status_for(exc)
    headers: dict[str, str] = {}
    if isinstance(exc, e.ResourceExhausted | e.Unavailable):
        headers["Retry-After"] = str(exc.retry_after_seconds)
    if isinstance(exc, e.Unauthenticated):
        headers["WWW-Authenticate"] = 'Bearer realm="kura"'
    if isinstance(exc, FutureVersion):
        headers[REFUSAL_HEADER] = FUTURE_VERSION  # the sender keeps it queued (mesh.shipper)
    if style == "text":
        # Exactly "text/plain": Nx 24 compares the header byte for byte, and aiohttp's ``text=``
        # would append "; charset=utf-8" (then Nx reports "Requests should respond with
        # text/plain on 401s" instead of "Unauthorized"). The message is ASCII or UTF-8.
        return web.Response(
            status=status, body=exc.message.encode(), headers=headers, content_type="text/plain"
        )
    doc: dict[str, object] = {"message": exc.message}
    if style == "vercel":
        # Not "remote_caching_*": turbo would switch remote caching off for the whole run.
        code = HTTPStatus(status).phrase.lower().replace(" ", "_")  # "forbidden", "bad_request"
        doc["error"] = {"code": code, "message": exc.message}
    return web.Response(
        status=status,
        body=json.dumps(doc),
        headers=headers,
        content_type="application/json",
    )
