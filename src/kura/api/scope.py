"""Tenant and namespace scoping of Kura's own routes, and the namespace in a path.

``tenant_id`` is required (400 "Missing tenant_id"), with the legacy alias ``account_handle``;
``namespace_id`` (alias ``project_handle``) is optional and empty means tenant scope. The query
tenant never changes an artifact's identity: storage uses the node's configured tenant
(kura-behaviour.md §1.2, "Storage identity ignores the query tenant_id").

The Bazel, plain HTTP-cache (ccache, Gradle ``HttpBuildCache``) and WebDAV (sccache) clients
cannot add a query to their URLs, so their routes take a namespace from the path instead:
``NAMESPACED_PREFIX`` (``/ns/{namespace}``) before the route's own prefix, as in
``/ns/team1/cache/ac/<sha256>``. Without it they store in namespace ``""``, as before.

So the first path segment ``ns`` is reserved: a prefix starting with it is refused at start-up
(``kura.settings_rules``).
"""

from __future__ import annotations

from aiohttp import web

from kura.api.http import query_param
from kura.core.errors import InvalidRequest
from kura.core.keys import NAMESPACE, validate

# Mounted before KURA_HTTP_CACHE_PREFIX and KURA_WEBDAV_PREFIX (kura.app); its first segment is
# reserved (kura.settings refuses a prefix that starts with it).
NAMESPACED_PREFIX = "/ns/{namespace}"


def path_namespace(request: web.Request) -> str:
    """The namespace a route mounted under ``NAMESPACED_PREFIX`` names (``""`` on the same
    route without it). Raises ``InvalidRequest`` (400) for one outside the namespace
    alphabet."""
    return validate(request.match_info.get("namespace", ""), NAMESPACE, "namespace")


def namespace_of(request: web.Request) -> str:
    """Validate the request's tenant and return its namespace ('' for tenant scope)."""
    tenant = query_param(request, "tenant_id", "account_handle")
    if tenant is None:
        raise InvalidRequest("Missing tenant_id")
    validate(tenant, NAMESPACE, "tenant_id")
    namespace = query_param(request, "namespace_id", "project_handle") or ""
    return validate(namespace, NAMESPACE, "namespace_id")
