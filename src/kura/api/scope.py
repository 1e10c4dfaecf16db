"""Tenant and namespace scoping of Kura's own routes.

``tenant_id`` is required (400 "Missing tenant_id"), with the legacy alias ``account_handle``;
``namespace_id`` (alias ``project_handle``) is optional and empty means tenant scope. The query
tenant never changes an artifact's identity: storage uses the node's configured tenant
(kura-behaviour.md §1.2, "Storage identity ignores the query tenant_id").
"""

from __future__ import annotations

from aiohttp import web

from kura.api.http import query_param
from kura.core.errors import InvalidRequest
from kura.core.keys import NAMESPACE, validate


def namespace_of(request: web.Request) -> str:
    """Validate the request's tenant and return its namespace ('' for tenant scope)."""
    tenant = query_param(request, "tenant_id", "account_handle")
    if tenant is None:
        raise InvalidRequest("Missing tenant_id")
    validate(tenant, NAMESPACE, "tenant_id")
    namespace = query_param(request, "namespace_id", "project_handle") or ""
    return validate(namespace, NAMESPACE, "namespace_id")
