"""A Kubernetes API server TEST DOUBLE, over real HTTP on 127.0.0.1.

No API server runs on this machine, so kured's Kubernetes code is tested against this double.
It is *not* Kubernetes: it holds objects in memory and implements only the REST surface kured
uses, but for that surface it enforces the real server's rules, so the official ``kubernetes``
Python client talks to it unmodified (a kubeconfig pointing at it over plain http with a bearer
token, see ``kubeconfig``):

* **Auth.** Every request needs ``Authorization: Bearer <token>``; otherwise 401 ``Status``.
* **resourceVersion.** One counter for the whole store, as etcd's revision is for a real
  server. Every write that changes an object gives it the next value. A PUT (or a patch) whose
  ``metadata.resourceVersion`` differs from the stored one answers **409 Conflict** with the
  real message ("the object has been modified; please apply your changes to the latest version
  and try again"); a PUT without one is unconditional, as for DaemonSets on a real server. A
  write that changes nothing does not bump it.
* **DaemonSets** (``/apis/apps/v1/namespaces/{ns}/daemonsets/{name}``): GET, PUT (the whole
  object; ``uid``, ``creationTimestamp`` and ``status`` are kept from the stored object, as the
  real server ignores them in an update), PATCH.
* **Nodes** (``/api/v1/nodes[/{name}]``): GET, list, PATCH. Patches: JSON merge
  (``application/merge-patch+json``, RFC 7386), strategic merge (identical to JSON merge for
  the scalars and string maps kured touches; lists are replaced, ``$patch`` directives are
  refused with 422) and JSON patch (``application/json-patch+json``, RFC 6902: add, remove,
  replace, test; a failed ``test`` or a missing path is 422). The result is validated like the
  real server does for those fields: ``spec.unschedulable`` a boolean, labels with valid keys
  and values, string annotations, ``spec.taints`` with valid keys, a known effect and unique
  (key, effect) pairs; anything else is **422 Invalid**.
* **Pods**: list across namespaces (``/api/v1/pods``) or in one, with ``labelSelector``
  (equality and set-based: ``k=v``, ``k==v``, ``k!=v``, ``k``, ``!k``, ``k in (a,b)``,
  ``k notin (a,b)``) and ``fieldSelector`` (``metadata.name``, ``metadata.namespace``,
  ``spec.nodeName``, ``status.phase`` with ``=``, ``==``, ``!=``; other fields are a 400, as on
  a real server), ``limit`` and ``continue``; GET; DELETE (with ``gracePeriodSeconds``).
* **Eviction** (``POST …/pods/{name}/eviction``, policy/v1): 404 for a missing pod; pods that
  are Pending, Succeeded, Failed or already terminating are deleted without consulting budgets
  (the real server's rule); otherwise every PodDisruptionBudget in the namespace whose selector
  matches the pod is consulted (more than one is a 500, as on a real server) and when it allows
  no disruption - ``maxUnavailable: 0``, or a ``minAvailable`` the eviction would violate,
  integers or percentages rounded up - the answer is **429 TooManyRequests** with a
  ``DisruptionBudget`` cause naming the budget. Healthy means Running and not terminating.
  An allowed eviction answers 201 and deletes the pod with the eviction's grace period (else
  the pod's ``terminationGracePeriodSeconds``): with a grace period the pod first gets a
  ``deletionTimestamp`` and disappears ``grace × time_scale`` seconds later.
* **Controllers, simulated.** A pod controlled by a ``ReplicaSet`` gets a replacement (new name,
  new UID) on another schedulable node as soon as it starts terminating; one controlled by a
  ``StatefulSet`` is recreated with the *same name and a new UID* once it is gone - so a drain
  must wait for "gone or UID changed", as kubectl's does.
* **Leases** (``coordination.k8s.io/v1``): create (409 AlreadyExists), GET, PUT (409 on a
  stale resourceVersion), validated; in ``tests.kured.k8s_leases``.
* **PodDisruptionBudgets** (policy/v1): listed per namespace and across namespaces, each with
  the ``status`` the disruption controller keeps (``currentHealthy``, ``desiredHealthy``,
  ``expectedPods``, ``disruptionsAllowed = max(0, currentHealthy - desiredHealthy)``), computed
  when listed by the same rule the eviction uses, so it follows the pods at once (a real
  controller lags a little). ``add_pdb`` with an existing name replaces the budget.

Errors are ``Status`` objects with the real ``reason`` values (``NotFound``, ``Conflict``,
``TooManyRequests``, ``Invalid``, ``BadRequest``, ``Unauthorized``, ``MethodNotAllowed``).

Test-side helpers (``add_node``, ``add_pod``, ``add_pdb``, ``add_daemonset``, ``node``, ``pod``,
``daemonset``, ``set_pod_phase``, ``touch_daemonset``, ``conflict_next_puts``) change or read
the store directly, under the same lock the handlers use; ``requests`` and ``evictions`` record
what clients did, and ``annotation_history`` every stored value of a DaemonSet annotation.
``schedulable_history`` records every stored Node version as (monotonic seconds, node,
unschedulable). Faults: ``fail_next_uncordons`` answers **500 InternalError** (the real
``Status`` a failing apiserver or admission webhook gives) to a node's next uncordons - patches
that would turn ``spec.unschedulable`` from true to false - without storing them.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import math
import re
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiohttp import web

from tests.kured.k8s_leases import LeaseRoutes

Obj = dict[str, Any]

_LABEL_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)$")
_DNS_PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_POD_FIELDS = {
    "metadata.name": ("metadata", "name"),
    "metadata.namespace": ("metadata", "namespace"),
    "spec.nodeName": ("spec", "nodeName"),
    "status.phase": ("status", "phase"),
}


class ApiFailure(Exception):
    """An error answer: HTTP status, Status.reason, message, optional details."""

    def __init__(self, code: int, reason: str, message: str, details: Obj | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details


def status_body(code: int, reason: str, message: str, details: Obj | None = None) -> Obj:
    body: Obj = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure" if code >= 300 else "Success",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = details
    return body


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- selectors ----------------------------------------------------------------------------------


def _split_top(text: str) -> list[str]:
    """Split on commas outside parentheses."""
    parts, depth, current = [], 0, ""
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return [p.strip() for p in parts if p.strip()]


_SET_REQ = re.compile(r"^([^\s!=(),]+)\s+(in|notin)\s+\(([^()]*)\)$")
_EQ_REQ = re.compile(r"^([^\s!=(),]+)\s*(==|!=|=)\s*([^\s!=(),]*)$")
_KEY = re.compile(r"^(!?)\s*([^\s!=(),]+)$")


def parse_label_selector(text: str) -> list[tuple[str, str, tuple[str, ...]]]:
    """[(key, op, values)] with op in =, !=, in, notin, exists, !exists. Raises ApiFailure."""
    out: list[tuple[str, str, tuple[str, ...]]] = []
    for part in _split_top(text):
        if m := _SET_REQ.match(part):
            values = tuple(v.strip() for v in m.group(3).split(",") if v.strip())
            out.append((m.group(1), m.group(2), values))
        elif m := _EQ_REQ.match(part):
            op = "!=" if m.group(2) == "!=" else "="
            out.append((m.group(1), op, (m.group(3),)))
        elif m := _KEY.match(part):
            out.append((m.group(2), "!exists" if m.group(1) else "exists", ()))
        else:
            raise ApiFailure(400, "BadRequest", f"unable to parse requirement: {part!r}")
    return out


def labels_match(reqs: list[tuple[str, str, tuple[str, ...]]], labels: Mapping[str, str]) -> bool:
    for key, op, values in reqs:
        present, value = key in labels, labels.get(key)
        if op == "=":
            ok = present and value == values[0]
        elif op == "!=":
            ok = not present or value != values[0]
        elif op == "in":
            ok = present and value in values
        elif op == "notin":
            ok = not present or value not in values
        else:
            ok = present if op == "exists" else not present
        if not ok:
            return False
    return True


def parse_field_selector(text: str) -> list[tuple[tuple[str, str], bool, str]]:
    """[(path, equal?, value)] for pods. Raises ApiFailure for unsupported fields."""
    out = []
    for part in _split_top(text):
        m = re.match(r"^([A-Za-z.]+)\s*(==|!=|=)\s*(.*)$", part)
        if m is None:
            raise ApiFailure(400, "BadRequest", f"invalid field selector: {part!r}")
        field_name = m.group(1)
        if field_name not in _POD_FIELDS:
            raise ApiFailure(400, "BadRequest", f'field label not supported: "{field_name}"')
        out.append((_POD_FIELDS[field_name], m.group(2) != "!=", m.group(3)))
    return out


def pdb_selects(selector: Obj | None, labels: Mapping[str, str]) -> bool:
    """policy/v1 semantics: an empty selector selects every pod in the namespace."""
    selector = selector or {}
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def _scaled(value: int | str, total: int) -> int:
    if isinstance(value, str) and value.endswith("%"):
        return math.ceil(int(value[:-1]) * total / 100)
    return int(value)


# --- patches ------------------------------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _has_directive(patch: Any) -> bool:
    if isinstance(patch, dict):
        return any(k.startswith("$") or _has_directive(v) for k, v in patch.items())
    if isinstance(patch, list):
        return any(_has_directive(v) for v in patch)
    return False


def _pointer(path: str) -> list[str]:
    if not path.startswith("/"):
        raise ApiFailure(422, "Invalid", f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def json_patch(target: Obj, ops: list[Any]) -> Obj:
    """RFC 6902 add/remove/replace/test."""
    doc = copy.deepcopy(target)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise ApiFailure(422, "Invalid", f"malformed JSON patch operation {op!r}")
        *parents, last = _pointer(op["path"])
        node: Any = doc
        for part in parents:
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                raise ApiFailure(422, "Invalid", f"path {op['path']!r} does not exist")
        kind = op["op"]
        if kind == "test":
            current = node.get(last) if isinstance(node, dict) else None
            if current != op.get("value"):
                raise ApiFailure(422, "Invalid", f"testing value {op['path']} failed")
        elif kind in ("add", "replace"):
            if kind == "replace" and (not isinstance(node, dict) or last not in node):
                raise ApiFailure(422, "Invalid", f"replace: missing path {op['path']!r}")
            if isinstance(node, dict):
                node[last] = copy.deepcopy(op.get("value"))
            else:
                raise ApiFailure(422, "Invalid", "only object members are supported here")
        elif kind == "remove":
            if not isinstance(node, dict) or last not in node:
                raise ApiFailure(422, "Invalid", f"remove: missing path {op['path']!r}")
            del node[last]
        else:
            raise ApiFailure(422, "Invalid", f"unsupported JSON patch op {kind!r}")
    return doc


def _label_key_ok(key: str) -> bool:
    """A qualified name, the rule for label keys and taint keys."""
    prefix, _, name = key.rpartition("/")
    if not name or len(name) > 63 or not _LABEL_NAME.match(name):
        return False
    return not prefix or (len(prefix) <= 253 and bool(_DNS_PREFIX.match(prefix)))


def _validate_metadata(obj: Obj) -> None:
    meta = obj.get("metadata") or {}
    causes = []
    for key, value in (meta.get("labels") or {}).items():
        prefix, _, name = key.rpartition("/")
        if not isinstance(value, str) or len(value) > 63 or not _LABEL_VALUE.match(value):
            causes.append(f"metadata.labels: Invalid value: {value!r}")
        if not name or len(name) > 63 or not _LABEL_NAME.match(name):
            causes.append(f"metadata.labels: Invalid value: {key!r}: name part invalid")
        if prefix and (len(prefix) > 253 or not _DNS_PREFIX.match(prefix)):
            causes.append(f"metadata.labels: Invalid value: {key!r}: prefix invalid")
    for key, value in (meta.get("annotations") or {}).items():
        if not isinstance(value, str):
            causes.append(f"metadata.annotations.{key}: must be a string")
    if causes:
        raise ApiFailure(
            422,
            "Invalid",
            "; ".join(causes),
            {"causes": [{"reason": "FieldValueInvalid", "message": c} for c in causes]},
        )


def _validate_node(obj: Obj) -> None:
    _validate_metadata(obj)
    unschedulable = (obj.get("spec") or {}).get("unschedulable")
    if unschedulable is not None and not isinstance(unschedulable, bool):
        raise ApiFailure(422, "Invalid", "spec.unschedulable: must be a boolean")
    taints = (obj.get("spec") or {}).get("taints") or []
    if not isinstance(taints, list):
        raise ApiFailure(422, "Invalid", "spec.taints: must be a list")
    seen = set()
    for taint in taints:
        key, effect = (taint or {}).get("key", ""), (taint or {}).get("effect", "")
        if not isinstance(key, str) or not _label_key_ok(key):
            raise ApiFailure(422, "Invalid", f"spec.taints.key: Invalid value: {key!r}")
        if effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
            raise ApiFailure(422, "Invalid", f"spec.taints.effect: Unsupported value: {effect!r}")
        if (key, effect) in seen:
            raise ApiFailure(
                422,
                "Invalid",
                "spec.taints: Duplicate value: taints must be unique by key and effect pair",
            )
        seen.add((key, effect))


# --- the double ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    at: float
    method: str
    path: str
    query: str
    status: int


@dataclass(frozen=True)
class Eviction:
    at: float
    namespace: str
    name: str
    grace_period_seconds: int | None
    status: int


class KubeDouble(LeaseRoutes):
    """The double (see the module docstring). Use as a context manager or start()/stop().

    ``time_scale`` multiplies grace periods (seconds) into real seconds, so a pod with a 30 s
    grace period lingers 30 × ``time_scale`` seconds.
    """

    def __init__(self, token: str = "kured-double-token", time_scale: float = 0.02) -> None:
        self.token = token
        self.time_scale = time_scale
        self.url = ""
        self._lock = threading.RLock()
        self._rv = 100
        self._objects: dict[tuple[str, str, str], Obj] = {}  # (kind, namespace, name)
        self._conflicts_pending = 0
        self.requests: list[Request] = []
        self.evictions: list[Eviction] = []
        self._history: dict[tuple[str, str], list[Obj]] = {}  # every stored DaemonSet version
        self._lease_history: dict[tuple[str, str], list[Obj]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._ready = threading.Event()
        self._seq = 0
        self._uncordon_faults: dict[str, int] = {}
        self.schedulable_history: list[tuple[float, str, bool]] = []

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> KubeDouble:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def start(self) -> KubeDouble:
        self._thread = threading.Thread(target=self._serve, name="kube-double", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the Kubernetes double did not start")
        return self

    def stop(self) -> None:
        loop, runner = self._loop, self._runner
        if loop is None:
            return
        if runner is not None:
            asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        assert self._thread is not None
        self._thread.join(10)
        self._loop = None

    def _serve(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        app = web.Application(middlewares=[self._middleware], client_max_size=16 * 1024 * 1024)
        r = app.router
        r.add_route("GET", "/api/v1/nodes", self._list_nodes)
        r.add_route("*", "/api/v1/nodes/{name}", self._node)
        r.add_route("GET", "/api/v1/pods", self._list_pods)
        r.add_route("GET", "/api/v1/namespaces/{ns}/pods", self._list_pods)
        r.add_route("*", "/api/v1/namespaces/{ns}/pods/{name}", self._pod)
        r.add_route("*", "/api/v1/namespaces/{ns}/pods/{name}/eviction", self._evict)
        r.add_route("*", "/apis/apps/v1/namespaces/{ns}/daemonsets/{name}", self._daemonset)
        r.add_route("GET", "/apis/policy/v1/poddisruptionbudgets", self._list_pdbs)
        r.add_route("GET", "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets", self._list_pdbs)
        self._add_lease_routes(r)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    def kubeconfig(self, path: Path) -> Path:
        """Write a kubeconfig (JSON is YAML) for this double and return its path."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "double", "cluster": {"server": self.url}}],
            "users": [{"name": "kured", "user": {"token": self.token}}],
            "contexts": [{"name": "double", "context": {"cluster": "double", "user": "kured"}}],
            "current-context": "double",
        }
        path.write_text(json.dumps(config))
        return path

    # -- test-side helpers -------------------------------------------------------------------

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def _store(self, kind: str, obj: Obj) -> Obj:
        meta = obj.setdefault("metadata", {})
        meta["resourceVersion"] = self._next_rv()
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", now_rfc3339())
        key = (kind, meta.get("namespace", ""), meta["name"])
        self._objects[key] = obj
        if kind == "DaemonSet":
            self._history.setdefault(key[1:], []).append(copy.deepcopy(obj))
        if kind == "Node":
            cordoned = bool((obj.get("spec") or {}).get("unschedulable"))
            self.schedulable_history.append((time.monotonic(), meta["name"], cordoned))
        return copy.deepcopy(obj)

    def add_daemonset(
        self, namespace: str, name: str, annotations: Mapping[str, str] | None = None
    ) -> Obj:
        with self._lock:
            return self._store(
                "DaemonSet",
                {
                    "apiVersion": "apps/v1",
                    "kind": "DaemonSet",
                    "metadata": {
                        "name": name,
                        "namespace": namespace,
                        "labels": {"app": name},
                        "annotations": dict(annotations or {}),
                        "generation": 1,
                    },
                    "spec": {
                        "selector": {"matchLabels": {"app": name}},
                        "template": {
                            "metadata": {"labels": {"app": name}},
                            "spec": {"containers": [{"name": name, "image": "kured:test"}]},
                        },
                        "updateStrategy": {"type": "RollingUpdate"},
                        # A field this client's models do not know: a PUT must keep it.
                        "futureField": {"kept": True},
                    },
                    "status": {
                        "currentNumberScheduled": 1,
                        "desiredNumberScheduled": 1,
                        "numberMisscheduled": 0,
                        "numberReady": 1,
                    },
                },
            )

    def add_node(
        self,
        name: str,
        *,
        unschedulable: bool = False,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        addresses: Sequence[tuple[str, str]] = (),
        taints: Sequence[Obj] = (),
        ready: bool = True,
    ) -> Obj:
        """A Node; ``addresses`` are (type, address) pairs for ``status.addresses``;
        ``ready`` False: its Ready condition is False (a kubelet that stopped reporting)."""
        spec: Obj = {"podCIDR": "10.0.0.0/24"}
        if unschedulable:
            spec["unschedulable"] = True
        if taints:
            spec["taints"] = [dict(t) for t in taints]
        with self._lock:
            return self._store(
                "Node",
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {
                        "name": name,
                        "labels": {"kubernetes.io/hostname": name, **(labels or {})},
                        "annotations": dict(annotations or {}),
                    },
                    "spec": spec,
                    "status": {
                        "conditions": [{"type": "Ready", "status": str(ready)}],
                        "addresses": [{"type": t, "address": a} for t, a in addresses],
                    },
                },
            )

    def add_pod(
        self,
        namespace: str,
        name: str,
        node: str,
        *,
        labels: Mapping[str, str] | None = None,
        phase: str = "Running",
        owner: tuple[str, str] | None = None,
        mirror: bool = False,
        grace_seconds: int = 30,
        terminating_since: str | None = None,
    ) -> Obj:
        """A pod on ``node``. ``owner`` is (kind, name) of its controller (ReplicaSet,
        StatefulSet, DaemonSet, Job...); ``mirror`` makes it a static pod's mirror;
        ``terminating_since`` (RFC 3339) makes it a pod stuck terminating (a finalizer that
        never finishes): it has that ``deletionTimestamp`` and never goes away by itself."""
        meta: Obj = {"name": name, "namespace": namespace, "labels": dict(labels or {})}
        if terminating_since is not None:
            meta["deletionTimestamp"] = terminating_since
            meta["finalizers"] = ["example.com/never"]
        if owner is not None:
            api = (
                "apps/v1" if owner[0] in ("ReplicaSet", "StatefulSet", "DaemonSet") else "batch/v1"
            )
            meta["ownerReferences"] = [
                {
                    "apiVersion": api,
                    "kind": owner[0],
                    "name": owner[1],
                    "uid": str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{namespace}/{owner[1]}")),
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ]
        if mirror:
            meta["annotations"] = {"kubernetes.io/config.mirror": "mirror-hash"}
        with self._lock:
            return self._store(
                "Pod",
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": meta,
                    "spec": {
                        "nodeName": node,
                        "terminationGracePeriodSeconds": grace_seconds,
                        "containers": [{"name": "main", "image": "busybox"}],
                    },
                    "status": {"phase": phase},
                },
            )

    def add_pdb(
        self,
        namespace: str,
        name: str,
        match_labels: Mapping[str, str],
        *,
        max_unavailable: int | str | None = None,
        min_available: int | str | None = None,
    ) -> Obj:
        spec: Obj = {"selector": {"matchLabels": dict(match_labels)}}
        if max_unavailable is not None:
            spec["maxUnavailable"] = max_unavailable
        if min_available is not None:
            spec["minAvailable"] = min_available
        with self._lock:
            return self._store(
                "PodDisruptionBudget",
                {
                    "apiVersion": "policy/v1",
                    "kind": "PodDisruptionBudget",
                    "metadata": {"name": name, "namespace": namespace},
                    "spec": spec,
                },
            )

    def delete_pdb(self, namespace: str, name: str) -> None:
        with self._lock:
            self._objects.pop(("PodDisruptionBudget", namespace, name), None)

    def node(self, name: str) -> Obj:
        with self._lock:
            return copy.deepcopy(self._objects[("Node", "", name)])

    def pod(self, namespace: str, name: str) -> Obj | None:
        with self._lock:
            obj = self._objects.get(("Pod", namespace, name))
            return copy.deepcopy(obj) if obj is not None else None

    def pods(self) -> list[Obj]:
        with self._lock:
            return [
                copy.deepcopy(o) for (k, _, _), o in sorted(self._objects.items()) if k == "Pod"
            ]

    def daemonset(self, namespace: str, name: str) -> Obj:
        with self._lock:
            return copy.deepcopy(self._objects[("DaemonSet", namespace, name)])

    def annotation(self, namespace: str, name: str, key: str) -> str | None:
        annotations = self.daemonset(namespace, name)["metadata"].get("annotations") or {}
        value = annotations.get(key)
        return value if isinstance(value, str) else None

    def set_annotation(self, namespace: str, name: str, key: str, value: str | None) -> None:
        """Write (or with None remove) a DaemonSet annotation as another client would."""
        with self._lock:
            obj = copy.deepcopy(self._objects[("DaemonSet", namespace, name)])
            annotations = obj["metadata"].setdefault("annotations", {})
            if value is None:
                annotations.pop(key, None)
            else:
                annotations[key] = value
            self._store("DaemonSet", obj)

    def annotation_history(self, namespace: str, name: str, key: str) -> list[str | None]:
        """The annotation's value in every stored version of the DaemonSet, oldest first."""
        with self._lock:
            versions = list(self._history.get((namespace, name), []))
        return [(v["metadata"].get("annotations") or {}).get(key) for v in versions]

    def touch_daemonset(self, namespace: str, name: str) -> None:
        """An unrelated update (a Helm sync): bumps the resourceVersion, so in-flight PUTs 409."""
        with self._lock:
            obj = copy.deepcopy(self._objects[("DaemonSet", namespace, name)])
            labels = obj["metadata"].setdefault("labels", {})
            labels["touched"] = str(int(labels.get("touched", "0")) + 1)
            self._store("DaemonSet", obj)

    def conflict_next_puts(self, count: int) -> None:
        """Make another writer win the race against each of the next ``count`` DaemonSet PUTs:
        just before handling it, the double stores an unrelated change (``touch_daemonset``),
        so the PUT's resourceVersion is stale and it gets the real 409."""
        with self._lock:
            self._conflicts_pending += count

    def fail_next_uncordons(self, node: str, count: int) -> None:
        """Answer 500 to the next ``count`` patches that would uncordon ``node``."""
        with self._lock:
            self._uncordon_faults[node] = self._uncordon_faults.get(node, 0) + count

    def set_pod_phase(self, namespace: str, name: str, phase: str) -> None:
        with self._lock:
            obj = copy.deepcopy(self._objects[("Pod", namespace, name)])
            obj["status"]["phase"] = phase
            self._store("Pod", obj)

    def count(self, method: str, path_re: str, status: int | None = None) -> int:
        with self._lock:
            return sum(
                1
                for r in self.requests
                if r.method == method
                and re.search(path_re, r.path)
                and (status is None or r.status == status)
            )

    # -- HTTP plumbing -----------------------------------------------------------------------

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            if request.headers.get("Authorization") != f"Bearer {self.token}":
                raise ApiFailure(401, "Unauthorized", "Unauthorized")
            response: web.StreamResponse = await handler(request)
        except ApiFailure as exc:
            response = web.json_response(
                status_body(exc.code, exc.reason, exc.message, exc.details), status=exc.code
            )
        except web.HTTPNotFound:
            response = web.json_response(
                status_body(404, "NotFound", "the server could not find the requested resource"),
                status=404,
            )
        except web.HTTPMethodNotAllowed:
            response = web.json_response(
                status_body(405, "MethodNotAllowed", "the server does not allow this method"),
                status=405,
            )
        with self._lock:
            self.requests.append(
                Request(
                    time.monotonic(),
                    request.method,
                    request.path,
                    request.query_string,
                    response.status,
                )
            )
        return response

    async def _json_body(self, request: web.Request) -> Any:
        try:
            return json.loads(await request.read())
        except ValueError as exc:
            raise ApiFailure(400, "BadRequest", f"request body is not JSON: {exc}") from exc

    def _get(self, kind: str, namespace: str, name: str, resource: str) -> Obj:
        obj = self._objects.get((kind, namespace, name))
        if obj is None:
            raise ApiFailure(
                404,
                "NotFound",
                f'{resource} "{name}" not found',
                {"name": name, "kind": resource.split(".")[0]},
            )
        return obj

    def _conflict(self, resource: str, name: str) -> ApiFailure:
        return ApiFailure(
            409,
            "Conflict",
            f'Operation cannot be fulfilled on {resource} "{name}": the object has been '
            "modified; please apply your changes to the latest version and try again",
            {"name": name, "kind": resource.split(".")[0]},
        )

    def _patched(self, content_type: str, raw: bytes, current: Obj, resource: str) -> Obj:
        """``current`` with the patch in ``raw`` applied (lock held), or ApiFailure."""
        content_type = content_type.split(";")[0].strip()
        try:
            patch = json.loads(raw)
        except ValueError as exc:
            raise ApiFailure(400, "BadRequest", f"request body is not JSON: {exc}") from exc
        if content_type == "application/json-patch+json":
            if not isinstance(patch, list):
                raise ApiFailure(400, "BadRequest", "a JSON patch must be a list of operations")
            return json_patch(current, patch)
        if content_type in (
            "application/merge-patch+json",
            "application/strategic-merge-patch+json",
        ):
            if not isinstance(patch, dict):
                raise ApiFailure(400, "BadRequest", "a merge patch must be a JSON object")
            if content_type.startswith("application/strategic") and _has_directive(patch):
                raise ApiFailure(422, "Invalid", "this double does not implement $ directives")
            wanted = (patch.get("metadata") or {}).get("resourceVersion")
            if wanted is not None and wanted != current["metadata"]["resourceVersion"]:
                raise self._conflict(resource, current["metadata"]["name"])
            return merge_patch(current, patch)
        raise ApiFailure(
            415,
            "UnsupportedMediaType",
            f"the body of the request was in an unknown format: {content_type}",
        )

    async def _patch(
        self, request: web.Request, kind: str, namespace: str, name: str, resource: str
    ) -> web.Response:
        raw = await request.read()
        with self._lock:
            current = copy.deepcopy(self._get(kind, namespace, name, resource))
            after = self._patched(request.headers.get("Content-Type", ""), raw, current, resource)
            if kind == "Node":
                _validate_node(after)
                uncordons = bool(current["spec"].get("unschedulable")) and not bool(
                    after["spec"].get("unschedulable")
                )
                if uncordons and self._uncordon_faults.get(name, 0) > 0:
                    self._uncordon_faults[name] -= 1
                    raise ApiFailure(
                        500, "InternalError", "Internal error occurred: injected uncordon fault"
                    )
            else:
                _validate_metadata(after)
            return web.json_response(self._commit(kind, current, after))

    def _commit(self, kind: str, before: Obj, after: Obj) -> Obj:
        """Store ``after`` if it differs from ``before`` (identity fields kept)."""
        for field_name in ("name", "namespace", "uid", "creationTimestamp", "resourceVersion"):
            if field_name in before["metadata"]:
                after["metadata"][field_name] = before["metadata"][field_name]
        if after == before:
            return copy.deepcopy(before)
        return self._store(kind, after)

    # -- DaemonSets --------------------------------------------------------------------------

    async def _daemonset(self, request: web.Request) -> web.Response:
        ns, name = request.match_info["ns"], request.match_info["name"]
        resource = "daemonsets.apps"
        if request.method == "GET":
            with self._lock:
                return web.json_response(copy.deepcopy(self._get("DaemonSet", ns, name, resource)))
        if request.method == "PUT":
            body = await self._json_body(request)
            with self._lock:
                if self._conflicts_pending > 0:
                    self._conflicts_pending -= 1
                    self.touch_daemonset(ns, name)
                current = self._get("DaemonSet", ns, name, resource)
                if not isinstance(body, dict) or body.get("kind") != "DaemonSet":
                    raise ApiFailure(400, "BadRequest", "the body is not a DaemonSet")
                meta = body.get("metadata") or {}
                if meta.get("name") != name or meta.get("namespace", ns) != ns:
                    raise ApiFailure(
                        400, "BadRequest", "the name of the object does not match the URL"
                    )
                wanted = meta.get("resourceVersion")
                if wanted and wanted != current["metadata"]["resourceVersion"]:
                    raise self._conflict(resource, name)
                _validate_metadata(body)
                after = copy.deepcopy(body)
                after["status"] = copy.deepcopy(current.get("status"))
                return web.json_response(self._commit("DaemonSet", current, after))
        if request.method == "PATCH":
            return await self._patch(request, "DaemonSet", ns, name, resource)
        raise web.HTTPMethodNotAllowed(request.method, ["GET", "PUT", "PATCH"])

    # -- Nodes -------------------------------------------------------------------------------

    async def _list_nodes(self, _request: web.Request) -> web.Response:
        with self._lock:
            items = [
                copy.deepcopy(o) for (k, _, _), o in sorted(self._objects.items()) if k == "Node"
            ]
            return web.json_response(
                {
                    "kind": "NodeList",
                    "apiVersion": "v1",
                    "metadata": {"resourceVersion": str(self._rv)},
                    "items": items,
                }
            )

    async def _node(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if request.method == "GET":
            with self._lock:
                return web.json_response(copy.deepcopy(self._get("Node", "", name, "nodes")))
        if request.method == "PATCH":
            return await self._patch(request, "Node", "", name, "nodes")
        raise web.HTTPMethodNotAllowed(request.method, ["GET", "PATCH"])

    # -- Pods --------------------------------------------------------------------------------

    def _matching_pods(self, namespace: str | None, labels: str, fields: str) -> list[Obj]:
        label_reqs = parse_label_selector(labels) if labels else []
        field_reqs = parse_field_selector(fields) if fields else []
        out = []
        for (kind, ns, _), obj in sorted(self._objects.items()):
            if kind != "Pod" or (namespace is not None and ns != namespace):
                continue
            if not labels_match(label_reqs, obj["metadata"].get("labels") or {}):
                continue
            ok = True
            for (section, key), equal, value in field_reqs:
                actual = (obj.get(section) or {}).get(key) or ""
                if (actual == value) != equal:
                    ok = False
                    break
            if ok:
                out.append(obj)
        return out

    async def _list_pods(self, request: web.Request) -> web.Response:
        q = request.query
        with self._lock:
            pods = self._matching_pods(
                request.match_info.get("ns"), q.get("labelSelector", ""), q.get("fieldSelector", "")
            )
            start = 0
            if q.get("continue"):
                try:
                    start = int(json.loads(base64.b64decode(q["continue"]))["start"])
                except (ValueError, KeyError, TypeError) as exc:
                    raise ApiFailure(400, "BadRequest", "invalid continue token") from exc
            limit = int(q.get("limit") or 0)
            end = start + limit if limit > 0 else len(pods)
            meta: Obj = {"resourceVersion": str(self._rv)}
            if end < len(pods):
                meta["continue"] = base64.b64encode(json.dumps({"start": end}).encode()).decode()
                meta["remainingItemCount"] = len(pods) - end
            items = [copy.deepcopy(p) for p in pods[start:end]]
        for item in items:
            item.pop("kind", None)
            item.pop("apiVersion", None)
        return web.json_response(
            {"kind": "PodList", "apiVersion": "v1", "metadata": meta, "items": items}
        )

    async def _pod(self, request: web.Request) -> web.Response:
        ns, name = request.match_info["ns"], request.match_info["name"]
        if request.method == "GET":
            with self._lock:
                return web.json_response(copy.deepcopy(self._get("Pod", ns, name, "pods")))
        if request.method == "DELETE":
            grace: int | None = None
            if request.query.get("gracePeriodSeconds"):
                grace = int(request.query["gracePeriodSeconds"])
            elif request.can_read_body:
                options = await self._json_body(request)
                grace = (options or {}).get("gracePeriodSeconds")
            with self._lock:
                pod = self._get("Pod", ns, name, "pods")
                self._begin_delete(pod, grace)
                return web.json_response(copy.deepcopy(pod))
        raise web.HTTPMethodNotAllowed(request.method, ["GET", "DELETE"])

    def _begin_delete(self, pod: Obj, grace: int | None) -> None:
        """Delete ``pod`` (lock held): at once with grace 0, else after grace × time_scale."""
        meta = pod["metadata"]
        if meta.get("deletionTimestamp"):
            return
        if grace is None:
            grace = int(pod["spec"].get("terminationGracePeriodSeconds", 30))
        key = ("Pod", meta["namespace"], meta["name"])
        uid = meta["uid"]
        if grace <= 0 or pod["status"].get("phase") in ("Succeeded", "Failed", "Pending"):
            self._replace(pod, immediately=True)
            self._finish_delete(key, uid)
            return
        meta["deletionTimestamp"] = now_rfc3339()
        meta["deletionGracePeriodSeconds"] = grace
        self._store("Pod", pod)
        self._replace(pod, immediately=True)
        assert self._loop is not None
        self._loop.call_later(grace * self.time_scale, self._finish_delete_locked, key, uid)

    def _finish_delete_locked(self, key: tuple[str, str, str], uid: str) -> None:
        with self._lock:
            self._finish_delete(key, uid)

    def _finish_delete(self, key: tuple[str, str, str], uid: str) -> None:
        pod = self._objects.get(key)
        if pod is None or pod["metadata"]["uid"] != uid:
            return
        del self._objects[key]
        self._replace(pod, immediately=False)

    def _replace(self, pod: Obj, *, immediately: bool) -> None:
        """What a controller would do: a ReplicaSet replaces a pod as soon as it terminates
        (new name), a StatefulSet once it is gone (same name, new UID)."""
        owners = [o for o in pod["metadata"].get("ownerReferences") or [] if o.get("controller")]
        if not owners:
            return
        kind = owners[0]["kind"]
        if (kind == "ReplicaSet") != immediately or kind not in ("ReplicaSet", "StatefulSet"):
            return
        old_node = pod["spec"].get("nodeName", "")
        nodes = sorted(
            n
            for (k, _, n), obj in self._objects.items()
            if k == "Node" and n != old_node and not (obj.get("spec") or {}).get("unschedulable")
        )
        fresh = copy.deepcopy(pod)
        meta = fresh["metadata"]
        for transient in (
            "uid",
            "resourceVersion",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
        ):
            meta.pop(transient, None)
        if kind == "ReplicaSet":
            self._seq += 1
            meta["name"] = f"{owners[0]['name']}-r{self._seq:04d}"
        fresh["spec"]["nodeName"] = nodes[0] if nodes else ""
        fresh["status"] = {"phase": "Running" if nodes else "Pending"}
        self._store("Pod", fresh)

    # -- eviction ----------------------------------------------------------------------------

    async def _evict(self, request: web.Request) -> web.Response:
        ns, name = request.match_info["ns"], request.match_info["name"]
        if request.method != "POST":
            raise web.HTTPMethodNotAllowed(request.method, ["POST"])
        body = await self._json_body(request)
        grace: int | None = None
        status = 500
        try:
            if not isinstance(body, dict) or body.get("kind") not in (None, "Eviction"):
                raise ApiFailure(400, "BadRequest", "the body is not an Eviction")
            if (body.get("metadata") or {}).get("name") != name:
                raise ApiFailure(
                    400, "BadRequest", "name in URL does not match name in Eviction object"
                )
            options = body.get("deleteOptions") or {}
            grace = options.get("gracePeriodSeconds")
            if grace is not None and (not isinstance(grace, int) or grace < 0):
                raise ApiFailure(422, "Invalid", "deleteOptions.gracePeriodSeconds: must be >= 0")
            with self._lock:
                pod = self._get("Pod", ns, name, "pods")
                terminating = bool(pod["metadata"].get("deletionTimestamp"))
                if not terminating and pod["status"].get("phase") == "Running":
                    self._check_budgets(ns, pod)
                self._begin_delete(pod, grace)
            status = 201
            return web.json_response(
                {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "metadata": {},
                    "status": "Success",
                    "code": 201,
                },
                status=201,
            )
        except ApiFailure as exc:
            status = exc.code
            raise
        finally:
            with self._lock:
                self.evictions.append(Eviction(time.monotonic(), ns, name, grace, status))

    def _check_budgets(self, namespace: str, pod: Obj) -> None:
        labels = pod["metadata"].get("labels") or {}
        budgets = [
            obj
            for (kind, ns, _), obj in sorted(self._objects.items())
            if kind == "PodDisruptionBudget"
            and ns == namespace
            and pdb_selects(obj["spec"].get("selector"), labels)
        ]
        if not budgets:
            return
        if len(budgets) > 1:
            raise ApiFailure(
                500,
                "InternalError",
                "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
            )
        pdb = budgets[0]
        desired, healthy, _expected = self._budget_counts(pdb)
        if healthy - desired <= 0:
            pdb_name = pdb["metadata"]["name"]
            raise ApiFailure(
                429,
                "TooManyRequests",
                "Cannot evict pod as it would violate the pod's disruption budget.",
                {
                    "causes": [
                        {
                            "reason": "DisruptionBudget",
                            "message": f"The disruption budget {pdb_name} needs {desired} healthy pods and has {healthy} currently",
                        }
                    ]
                },
            )

    def _budget_counts(self, pdb: Obj) -> tuple[int, int, int]:
        """(desiredHealthy, currentHealthy, expectedPods) of ``pdb`` now (lock held): the
        disruption controller's figures, with the pods its selector picks in its namespace as
        the expected count."""
        namespace = pdb["metadata"]["namespace"]
        selected = [
            obj
            for (kind, ns, _), obj in self._objects.items()
            if kind == "Pod"
            and ns == namespace
            and pdb_selects(pdb["spec"].get("selector"), obj["metadata"].get("labels") or {})
        ]
        expected = len(selected)
        healthy = sum(
            1
            for p in selected
            if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
        )
        spec = pdb["spec"]
        if "minAvailable" in spec:
            desired = _scaled(spec["minAvailable"], expected)
        else:
            desired = expected - _scaled(spec.get("maxUnavailable", 0), expected)
        return desired, healthy, expected

    def _with_status(self, pdb: Obj) -> Obj:
        """A copy of ``pdb`` with the ``status`` the disruption controller would have written
        (computed when read, so it always follows the pods; lock held)."""
        out = copy.deepcopy(pdb)
        desired, healthy, expected = self._budget_counts(pdb)
        out["status"] = {
            "observedGeneration": 1,
            "currentHealthy": healthy,
            "desiredHealthy": desired,
            "expectedPods": expected,
            "disruptionsAllowed": max(0, healthy - desired),
        }
        return out

    # -- PDBs --------------------------------------------------------------------------------

    async def _list_pdbs(self, request: web.Request) -> web.Response:
        namespace = request.match_info.get("ns")
        with self._lock:
            items = [
                self._with_status(o)
                for (k, ns, _), o in sorted(self._objects.items())
                if k == "PodDisruptionBudget" and (namespace is None or ns == namespace)
            ]
        return web.json_response(
            {
                "kind": "PodDisruptionBudgetList",
                "apiVersion": "policy/v1",
                "metadata": {},
                "items": items,
            }
        )
