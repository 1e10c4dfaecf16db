"""Refuse a request a web page made from another site (CSRF), on the public listener.

Build tools send neither ``Origin`` nor ``Sec-Fetch-Site``; a browser sends them. The status
page (``/ui``) asks the browser for Basic credentials, and a browser then attaches those to
requests other sites' pages make to this origin: a "simple" cross-site POST (an HTML form)
needs no CORS preflight, so any page an operator visits could purge a writer's entries
(``POST /_admin/purge``) or store bytes (``POST /api/cache/cas/...``). Every request that is
not GET, HEAD or OPTIONS is therefore refused with 403 when

* ``Sec-Fetch-Site`` says ``cross-site`` or ``same-site`` (the Fetch Metadata request headers,
  https://www.w3.org/TR/fetch-metadata/), or
* ``Origin`` is present and names another origin than the request's ``Host``, or is the
  opaque ``null`` (a sandboxed frame or a ``file:`` page: RFC 6454 §7.3).

Same-origin requests and requests without these headers (every client of the protocols kura
speaks) pass. Found by a hostile tester: a cross-site POST with the operator's credentials
purged a writer and stored ``poison`` under a CAS key.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from urllib.parse import urlsplit

from aiohttp import web
from aiohttp.typedefs import Middleware

from kura.api.errors import error_response
from kura.core.errors import Forbidden

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def cross_site_problem(method: str, headers: Mapping[str, str]) -> str | None:
    """Why a request with ``method`` and ``headers`` is a cross-site write, or None."""
    if method in SAFE_METHODS:
        return None
    site = headers.get("Sec-Fetch-Site", "").strip().lower()
    if site in ("cross-site", "same-site"):
        return f"Sec-Fetch-Site: {site}"
    origin = headers.get("Origin")
    if origin is None:
        return None
    if origin.strip().lower() == "null":
        return "Origin: null"
    parts = urlsplit(origin.strip())
    if parts.netloc.lower() != headers.get("Host", "").strip().lower():
        return f"Origin {parts.scheme}://{parts.netloc} is not this host"
    return None


def middleware() -> Middleware:
    """The aiohttp middleware of every public app (the primary's and each worker's:
    ``kura.api.http.serving_app``)."""

    @web.middleware
    async def refuse_cross_site(request: web.Request, handler: Handler) -> web.StreamResponse:
        problem = cross_site_problem(request.method, request.headers)
        if problem is None:
            return await handler(request)
        response = error_response(
            Forbidden(
                f"a request from a web page of another site may not change this cache "
                f"({problem[:200]}); build tools send no Origin"
            )
        )
        if request.body_exists:
            response.force_close()  # its body unread
        return response

    return refuse_cross_site
