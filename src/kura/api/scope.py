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

Which namespaces a request then reads and writes (its own, or its credential's overlay) is
decided where its right is checked: ``kura.api.http.namespaces`` (``kura.core.overlay``).
"""

from __future__ import annotations

from aiohttp import web

from kura.api.http import query_param
from kura.core.errors import InvalidRequest
from kura.core.keys import NAMESPACE, validate

# Mounted before KURA_HTTP_CACHE_PREFIX and KURA_WEBDAV_PREFIX (kura.app); its first segment is
# reserved (kura.settings refuses a prefix that starts with it).
NAMESPACED_PREFIX = "/ns/{namespace}"


def check_tenant(request: web.Request) -> None:
    """Validate the request's tenant (``InvalidRequest``: missing or malformed). Its namespace
    is the request's ``kura.api.http.namespaces``."""
    tenant = query_param(request, "tenant_id", "account_handle")
    if tenant is None:
        raise InvalidRequest("Missing tenant_id")
    validate(tenant, NAMESPACE, "tenant_id")
