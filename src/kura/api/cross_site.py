"""Refuse a request a web page made (CSRF, DNS rebinding), on every listener.

Build tools and peers send neither ``Origin`` nor ``Sec-Fetch-Site``; a browser sends
``Origin`` with every request that is not GET or HEAD. The status page (``/ui``) asks the
browser for Basic credentials, and a browser then attaches those to requests other sites'
pages make to this origin: a "simple" cross-site POST (an HTML form) needs no CORS preflight, so
any page an operator visits could purge a writer's entries (``POST /_admin/purge``) or store
bytes (``POST /api/cache/cas/...``). A page whose name an attacker rebinds to this node's
address is even same-origin, and could reach an open internal listener on loopback. No page of
kura's writes, so every request that is not GET, HEAD or OPTIONS is refused with 403 when

* it carries ``Origin`` at all (whatever it names: comparing it with ``Host`` lets a rebound
  name through and refuses proxies that rewrite ``Host``), or
* ``Sec-Fetch-Site`` says ``cross-site`` or ``same-site`` (the Fetch Metadata request headers,
  https://www.w3.org/TR/fetch-metadata/).

Found by a hostile tester: a cross-site POST with the operator's credentials purged a writer
and stored ``poison`` under a CAS key; the Origin-is-Host rule that first fixed it was
rebindable (a reviewer).
"""

from __future__ import annotations

from collections.abc import Mapping

from aiohttp import web

from kura.api.errors import error_response
from kura.core.errors import Forbidden

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def _problem(headers: Mapping[str, str]) -> str | None:
    """Why a request with ``headers`` and a method not in ``SAFE_METHODS`` (``refusal`` asks
    that first) is a write a web page made, or None."""
    site = headers.get("Sec-Fetch-Site", "").strip().lower()
    if site in ("cross-site", "same-site"):
        return f"Sec-Fetch-Site: {site}"
    origin = headers.get("Origin")
    if origin is not None:
        return f"Origin: {origin.strip()[:100]}"
    return None


def refusal(request: web.Request) -> web.Response | None:
    """The 403 for ``request`` if it is a write a web page made, else None. Every app of a
    serving process asks it first, in its one outer middleware (``kura.api.http.serving_app``:
    the primary's public and internal apps, each worker's)."""
    if request.method in SAFE_METHODS:  # most requests: no header looked at
        return None
    problem = _problem(request.headers)
    if problem is None:
        return None
    response = error_response(
        Forbidden(
            f"a request from a web page may not change this cache ({problem}); build "
            "tools and peers send no Origin"
        )
    )
    if request.body_exists:
        response.force_close()  # its body unread
    return response
