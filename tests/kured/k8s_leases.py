"""Lease semantics for the Kubernetes API server TEST DOUBLE (``tests.kured.k8s_double``).

It is a double, not Kubernetes: ``coordination.k8s.io/v1`` Leases in memory, with the rules of a
real server that a lock relies on:

* ``POST /apis/coordination.k8s.io/v1/namespaces/{ns}/leases`` creates; a name that exists
  answers **409 AlreadyExists** (``leases.coordination.k8s.io "<name>" already exists``);
  a ``metadata.resourceVersion`` in a create is refused (400), as the real server does;
* ``GET``/``PUT …/leases/{name}``; a PUT whose ``metadata.resourceVersion`` differs from the
  stored one answers **409 Conflict** (the real message); without one it is unconditional;
* validation as the real server's ``ValidateLeaseSpec``: ``holderIdentity`` a string,
  ``leaseDurationSeconds`` and ``leaseTransitions`` integers (> 0 and ≥ 0), ``acquireTime``
  and ``renewTime`` MicroTimes (RFC 3339 with six fraction digits) - otherwise 422 Invalid;
* every stored version is kept (``lease_history``) so a test can check each one.

Test-side helpers: ``add_lease``, ``lease``, ``set_lease`` (another client's write) and
``lease_history``.
"""

from __future__ import annotations

import copy
import re
import threading
from typing import Any

from aiohttp import web

Obj = dict[str, Any]
_MICRO_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}(Z|[+-]\d\d:\d\d)$")
RESOURCE = "leases.coordination.k8s.io"


def validate_lease(obj: Obj) -> list[str]:
    """The problems the real server's Lease validation reports for ``obj`` (empty: valid)."""
    spec = obj.get("spec") or {}
    problems = []
    holder = spec.get("holderIdentity")
    if holder is not None and not isinstance(holder, str):
        problems.append("spec.holderIdentity: must be a string")
    for key, low in (("leaseDurationSeconds", 1), ("leaseTransitions", 0)):
        value = spec.get(key)
        if value is not None and (not isinstance(value, int) or value < low):
            problems.append(f"spec.{key}: Invalid value: {value!r}: must be at least {low}")
    for key in ("acquireTime", "renewTime"):
        value = spec.get(key)
        if value is not None and not (isinstance(value, str) and _MICRO_TIME.match(value)):
            problems.append(f"spec.{key}: Invalid value: {value!r}: not a MicroTime")
    return problems


class LeaseRoutes:
    """Mixed into ``KubeDouble``: Lease handlers over its store (same lock, same counter)."""

    _lock: threading.RLock
    _objects: dict[tuple[str, str, str], Obj]
    _lease_history: dict[tuple[str, str], list[Obj]]

    # Provided by KubeDouble.
    def _store(self, kind: str, obj: Obj) -> Obj:
        raise NotImplementedError

    def _get(self, kind: str, namespace: str, name: str, resource: str) -> Obj:
        raise NotImplementedError

    def _conflict(self, resource: str, name: str) -> Exception:
        raise NotImplementedError

    def _commit(self, kind: str, before: Obj, after: Obj) -> Obj:
        raise NotImplementedError

    async def _json_body(self, request: web.Request) -> Any:
        raise NotImplementedError

    def _add_lease_routes(self, router: web.UrlDispatcher) -> None:
        base = "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"
        router.add_route("POST", base, self._create_lease)
        router.add_route("*", base + "/{name}", self._lease)

    # -- test side -----------------------------------------------------------------------------

    def _keep(self, namespace: str, name: str) -> None:
        obj = self._objects[("Lease", namespace, name)]
        self._lease_history.setdefault((namespace, name), []).append(copy.deepcopy(obj))

    def add_lease(self, namespace: str, name: str, spec: Obj | None = None) -> Obj:
        with self._lock:
            stored = self._store(
                "Lease",
                {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {"name": name, "namespace": namespace},
                    "spec": dict(spec or {}),
                },
            )
            self._keep(namespace, name)
            return stored

    def lease(self, namespace: str, name: str) -> Obj | None:
        with self._lock:
            obj = self._objects.get(("Lease", namespace, name))
            return copy.deepcopy(obj) if obj is not None else None

    def set_lease(
        self, namespace: str, name: str, *, spec: Obj | None = None, annotations: Obj | None = None
    ) -> None:
        """Another client's write: merge ``spec`` (None values remove keys) and replace the
        annotations when given. Creates the Lease when absent."""
        with self._lock:
            if ("Lease", namespace, name) not in self._objects:
                self.add_lease(namespace, name)
            obj = copy.deepcopy(self._objects[("Lease", namespace, name)])
            for key, value in (spec or {}).items():
                if value is None:
                    obj["spec"].pop(key, None)
                else:
                    obj["spec"][key] = value
            if annotations is not None:
                obj["metadata"]["annotations"] = dict(annotations)
            self._store("Lease", obj)
            self._keep(namespace, name)

    def lease_history(self, namespace: str, name: str) -> list[Obj]:
        """Every stored version of the Lease, oldest first."""
        with self._lock:
            return copy.deepcopy(self._lease_history.get((namespace, name), []))

    # -- HTTP ----------------------------------------------------------------------------------

    def _checked(self, body: Any, namespace: str) -> Obj:
        from tests.kured.k8s_double import ApiFailure, _validate_metadata

        if not isinstance(body, dict) or body.get("kind") != "Lease":
            raise ApiFailure(400, "BadRequest", "the body is not a Lease")
        meta = body.get("metadata") or {}
        if not meta.get("name") or meta.get("namespace", namespace) != namespace:
            raise ApiFailure(400, "BadRequest", "the namespace of the object does not match")
        _validate_metadata(body)
        problems = validate_lease(body)
        if problems:
            raise ApiFailure(
                422,
                "Invalid",
                f'Lease.coordination.k8s.io "{meta["name"]}" is invalid: ' + "; ".join(problems),
            )
        after = copy.deepcopy(body)
        after["metadata"]["namespace"] = namespace
        return after

    async def _create_lease(self, request: web.Request) -> web.Response:
        from tests.kured.k8s_double import ApiFailure

        ns = request.match_info["ns"]
        body = await self._json_body(request)
        with self._lock:
            obj = self._checked(body, ns)
            name = obj["metadata"]["name"]
            if obj["metadata"].get("resourceVersion"):
                raise ApiFailure(
                    400, "BadRequest", "resourceVersion should not be set on objects to be created"
                )
            if ("Lease", ns, name) in self._objects:
                raise ApiFailure(
                    409,
                    "AlreadyExists",
                    f'{RESOURCE} "{name}" already exists',
                    {"name": name, "group": "coordination.k8s.io", "kind": "leases"},
                )
            stored = self._store("Lease", obj)
            self._keep(ns, name)
            return web.json_response(stored, status=201)

    async def _lease(self, request: web.Request) -> web.Response:
        from tests.kured.k8s_double import ApiFailure

        ns, name = request.match_info["ns"], request.match_info["name"]
        if request.method == "GET":
            with self._lock:
                return web.json_response(copy.deepcopy(self._get("Lease", ns, name, RESOURCE)))
        if request.method == "PUT":
            body = await self._json_body(request)
            with self._lock:
                current = self._get("Lease", ns, name, RESOURCE)
                after = self._checked(body, ns)
                if after["metadata"]["name"] != name:
                    raise ApiFailure(
                        400, "BadRequest", "the name of the object does not match the URL"
                    )
                wanted = after["metadata"].get("resourceVersion")
                if wanted and wanted != current["metadata"]["resourceVersion"]:
                    raise self._conflict(RESOURCE, name)
                before_rv = current["metadata"]["resourceVersion"]
                stored = self._commit("Lease", current, after)
                if stored["metadata"]["resourceVersion"] != before_rv:
                    self._keep(ns, name)
                return web.json_response(stored)
        raise web.HTTPMethodNotAllowed(request.method, ["GET", "PUT"])
