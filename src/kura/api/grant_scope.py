"""The namespace a request touches, for a JWT grant limited to namespaces (``kura.api.auth``),
and what it names itself, for an overlay (``asked``, ``kura.core.overlay``).

Per protocol, the same namespace the route stores under: Kura's own routes the query's
``namespace_id`` (alias ``project_handle``; ``""`` is tenant scope, ``kura.api.scope``),
Turborepo the team (``teamId`` or ``slug``, ``kura.api.turbo``), Nx and Metro their fixed
namespaces ``nx`` and ``metro``, the Bazel, HTTP-cache and WebDAV routes the namespace in their
path (``/ns/{namespace}/...``, ``kura.api.scope.NAMESPACED_PREFIX``), or ``""``. None means the
route touches no namespace (``/status``, ``/metrics``, Turborepo's ``/v8/artifacts/status``
and events, which carry no team), so any read grant passes. The value is the raw query value:
a malformed one is refused by the grant check (403) or where the request's namespaces are
decided (400, ``kura.core.overlay.view_of``).
"""

from __future__ import annotations

from aiohttp import web

from kura.core.overlay import Asked

FIXED = {"nx": "nx", "metro": "metro", "bazel": "", "http_cache": "", "webdav": ""}
UNSCOPED = frozenset({"probe"})
# Built once: an ``Asked`` is an immutable tuple, and these are most requests' (``asked``).
_NOTHING = Asked(None, None)
_FIXED_ASKED = {protocol: Asked(None, namespace) for protocol, namespace in FIXED.items()}


def request_namespace(request: web.Request, protocol: str) -> str | None:
    """The namespace ``request`` on ``protocol``'s routes reads or writes, or None."""
    return asked(request, protocol).namespace


def asked(request: web.Request, protocol: str) -> Asked:
    """What ``request`` on ``protocol``'s routes names itself (``Asked.named``: a ``/ns/``
    path, a ``namespace_id``, a Turborepo team), and the protocol's default when it names
    none (``""``, ``nx``, ``metro``; None for Turborepo, whose routes need a team, and the
    routes that touch no namespace)."""
    if protocol in UNSCOPED:
        return _NOTHING
    in_path = request.match_info.get("namespace")
    if in_path is not None:
        return Asked(in_path, "")
    fixed = _FIXED_ASKED.get(protocol)
    if fixed is not None:
        return fixed
    if protocol == "turbo":
        return Asked(_first(request, "teamId", "slug"), None, "team")
    return Asked(_first(request, "namespace_id", "project_handle"), "", "namespace_id")


def _first(request: web.Request, *names: str) -> str | None:
    # kura.api.http.query_param's rule (first non-empty alias); not imported: http imports us.
    if not request.query_string:  # no query: nothing to parse
        return None
    return next((v for n in names if (v := request.query.get(n))), None)
