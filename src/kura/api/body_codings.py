"""Refuse a request body kura cannot take as it comes, before a byte of it is read, on every
listener.

kura stores the bytes a client sends, exactly: an artifact's body is served back unchanged
and content-addressed routes hash it as sent. No route decodes a coding a request declares
(metro-cache's gzip bodies are the artifact itself, sent without ``Content-Encoding``:
``kura.api.metro``), so

* a ``Content-Encoding`` other than ``identity`` is refused with 415 Unsupported Media Type and
  ``Accept-Encoding: identity`` (RFC 9110 §15.5.16: "the server SHOULD respond with a status
  code of 415 ... if the content coding is not acceptable"; §12.5.3 for the header), and
* a ``Transfer-Encoding`` that names a coding besides the final ``chunked`` (``gzip, chunked``)
  is refused with 501 Not Implemented (RFC 9112 §6.1: "A server that receives a request
  message with a transfer coding it does not understand SHOULD respond with 501"). aiohttp
  itself answers 400 when ``chunked`` is not the final coding (RFC 9112 §6.3).

Found by a hostile tester: aiohttp inflated a gzip body by itself, so a complete body was "400
body ended after 10 of 30 declared bytes", a bogus one a 500 with a traceback, and through a
worker (``kura.workers.forward``, which relayed the inflated body under the same header) a 500
or a 503 "retry" that clients retried for ever; ``gzip, chunked`` was stored still gzipped.
"""

from __future__ import annotations

from aiohttp import hdrs, web

from kura.api.errors import error_response
from kura.core.errors import UnsupportedContentCoding, UnsupportedTransferCoding

ACCEPTED_CONTENT_CODINGS = "identity"


def _codings(value: str) -> list[str]:
    """The codings a ``Content-Encoding`` or ``Transfer-Encoding`` value lists, lower-cased,
    in order, empty members dropped (RFC 9110 §5.6.1 lists)."""
    return [c for c in (part.strip(" \t").lower() for part in value.split(",")) if c]


def _problem(request: web.Request) -> UnsupportedContentCoding | UnsupportedTransferCoding | None:
    """Why ``request``'s body cannot be taken as it comes, or None."""
    content = request.headers.get(hdrs.CONTENT_ENCODING)
    if content is not None and any(c != "identity" for c in _codings(content)):
        return UnsupportedContentCoding(
            f"Content-Encoding {content.strip()[:100]!r} is not accepted: this cache stores "
            f"bodies as sent; send them with no Content-Encoding (accepted: "
            f"{ACCEPTED_CONTENT_CODINGS})"
        )
    transfer = request.headers.get(hdrs.TRANSFER_ENCODING)
    if transfer is not None and _codings(transfer) != ["chunked"]:
        return UnsupportedTransferCoding(
            f"Transfer-Encoding {transfer.strip()[:100]!r} is not implemented: this cache "
            "decodes chunked alone"
        )
    return None


def refusal(request: web.Request) -> web.Response | None:
    """The 415 or 501 for ``request`` if its body comes in a coding kura does not take, else
    None; a request without a body is not looked at. Every app of a serving process asks it in
    its one outer middleware (``kura.api.http.track_handlers``), before any handler reads the
    body; the connection is then closed, its body unread."""
    if not request.body_exists:  # most requests (GET, HEAD): no header looked at
        return None
    problem = _problem(request)
    if problem is None:
        return None
    response = error_response(problem)
    if isinstance(problem, UnsupportedContentCoding):
        response.headers[hdrs.ACCEPT_ENCODING] = ACCEPTED_CONTENT_CODINGS
    response.force_close()  # its body unread
    return response
