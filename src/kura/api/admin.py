"""Operator routes (issue 29 item 5): what each namespace holds and under which rules, who
wrote into one (provenance, issue 29 item 4), what one writer wrote, and the purge of exactly
that. ``kura admin`` (``kura.admin_client``) is their client; every answer is JSON.

* ``GET /_admin/namespaces``: ``{"namespaces": [...], "measured_at"}``, every namespace with an
  entry on this node, measured when asked (``Provenance.namespaces``, one scan of the index,
  O(rows); ``measured_at`` is then), largest first: ``namespace``, ``used_bytes``, ``artifacts``, its
  ``rule`` (``kura.core.namespace_rule``: pattern or ``(default)``, ``max_age_seconds``,
  ``quota_bytes``, ``min_age_seconds``) and the shed age of that rule since the node started
  (``kura_namespace_shed_age_seconds``' histogram, read as it is: the upper bound of the bucket
  holding the youngest entry evicted, and of the median; None when none was, or past the last
  bucket);
* ``GET /_admin/writers?namespace=NS``: ``{"namespace", "writers": [...]}``, each writer of
  ``NS`` on this node (``storage.ports.Provenance.writers``: ``writer``, ``entries``,
  ``bytes``, ``last_version_at``, ``vias``), most bytes first;
* ``GET /_admin/entries?namespace=NS&writer=W&limit=N``: ``{"namespace", "writer",
  "entries": [...]}``, the newest ``N`` (default ``DEFAULT_LIMIT``, at most ``MAX_LIMIT``) of
  ``W``'s entries in ``NS``: ``producer``, ``key``, ``size_bytes``, ``version_at``, ...;
* ``POST /_admin/purge?namespace=NS&writer=W``: deletes every entry ``W`` wrote in ``NS``, as a
  replicated clean (``ArtifactWriter.purge_writer``): ``{"namespace", "writer", "version_ms",
  "entries", "bytes"}``, the last two counted on this node.

``namespace=`` (empty) is the default namespace ``""``; ``writer=`` (empty) the writer of the
entries stored before provenance was recorded. A namespace outside the alphabet, a
writer that is not one (``kura.core.manifest``: visible ASCII, at most 200), or a limit out of
range is 400; the writers of a namespace with no entry on this node, or the entries of a writer
with none in it, 404 (a purge is recorded whatever this node holds).

Two ways in, one set of handlers:

* on the public port, with a credential holding ``clean`` (401 without one, 403 with another;
  ``kura.api.auth``): an overlay or namespace-limited credential may name only the namespace it
  writes, as for a clean, and its namespace list shows only those (``_visible_to``); nothing
  changes on a refusal;
* on the unix socket ``admin.sock`` in the data directory (``ADMIN_SOCKET``), mode 0600,
  created by the primary at start (a stale one, from a crash, replaced) and removed at stop:
  who may open it may administer the node, and no token is asked. A data directory whose path
  is too long for ``sun_path`` (unix(7)) is reached through ``/proc/self/fd``
  (``kit.unix_socket``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from kit.clock import Clock
from kura.api.auth import Access
from kura.api.http import VIEW_KEY, ctx, endpoint
from kura.api.query import parse_decimal
from kura.core.errors import InvalidRequest, NotFound
from kura.core.keys import NAMESPACE, validate
from kura.core.manifest import Manifest, writer_of
from kura.core.namespace_rule import DEFAULT_RULE, NamespaceRules
from kura.settings import ADMIN_SOCKET as ADMIN_SOCKET  # the app binds it
from kura.storage.ports import ArtifactWriter, Provenance
from kura.storage.stats import StorageStats

PROTOCOL = "admin"
DEFAULT_LIMIT = 100
MAX_LIMIT = 10_000
# The quantile read as "the youngest evicted": the first bucket holding any entry.
YOUNGEST = 1e-12


@dataclass
class AdminContext:
    """What the admin routes read and act on, besides ``kura.api.http.ApiContext``: the storage
    figures, the rules, who wrote what, and the purge."""

    stats: StorageStats
    rules: NamespaceRules
    provenance: Provenance
    writer: ArtifactWriter  # purge_writer
    clock: Clock  # when a namespace list was measured


ADMIN_KEY: web.AppKey[AdminContext] = web.AppKey("kura_admin_context")


def _admin(request: web.Request) -> AdminContext:
    return request.app[ADMIN_KEY]


def _namespace(request: web.Request) -> str:
    """The ``namespace`` query parameter (empty: ``""``), 400 when absent or malformed."""
    value = request.query.get("namespace")
    if value is None:
        raise InvalidRequest("name the namespace: ?namespace=NAME (empty for the default one)")
    return validate(value, NAMESPACE, "namespace")


def _writer(request: web.Request) -> str:
    value = request.query.get("writer")
    if value is None:  # empty: the entries written before provenance was recorded
        raise InvalidRequest("name the writer: ?writer=IDENTITY (as `kura admin writers` shows)")
    try:
        return writer_of(value)
    except ValueError as exc:
        raise InvalidRequest(f"a {exc}") from None


def _limit(request: web.Request) -> int:
    raw = request.query.get("limit")
    if raw is None:
        return DEFAULT_LIMIT
    value = parse_decimal(raw)
    if value is None or not 1 <= value <= MAX_LIMIT:
        raise InvalidRequest(f"limit must be a whole number from 1 to {MAX_LIMIT}")
    return value


def _at(ms: int) -> str:
    """Unix ms as RFC 3339 UTC."""
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat().replace("+00:00", "Z")


def _finite(seconds: float | None) -> float | None:
    return None if seconds is None or seconds == float("inf") else seconds


def _rule(rules: NamespaceRules, namespace: str) -> dict[str, Any]:
    rule = rules.rule_for(namespace)
    if rule is None:
        return {
            "pattern": DEFAULT_RULE,
            "max_age_seconds": None,
            "quota_bytes": None,
            "min_age_seconds": 0.0,
        }
    return {
        "pattern": rule.pattern,
        "max_age_seconds": rule.max_age_seconds,
        "quota_bytes": rule.quota_bytes,
        "min_age_seconds": rule.min_age_seconds,
    }


def _visible_to(request: web.Request) -> Callable[[str], bool]:
    """Which namespaces the caller's ``clean`` covers, so that the list names only those: with
    an overlay, the one it writes (its clean's namespace, ``kura.core.overlay``); with a JWT
    limited to namespaces, those; else every one (the admin socket included)."""
    view = request.get(VIEW_KEY)
    if view is not None:  # an overlay credential (a plain one asks no namespace here)
        return lambda ns: ns == view.write
    auth, authorization = ctx(request).auth, request.headers.get("Authorization")
    return lambda ns: auth.allows(authorization, Access.CLEAN, lambda: ns)


@endpoint(PROTOCOL, Access.CLEAN, namespace=lambda _request: None)
async def list_namespaces(request: web.Request) -> web.StreamResponse:
    a = _admin(request)
    measured = a.clock.now_ms()
    usage = await a.provenance.namespaces()
    visible = _visible_to(request)
    rows = []
    for ns, (size, entries) in sorted(usage.items(), key=lambda kv: (-kv[1][0], kv[0])):
        if not visible(ns):
            continue
        label = a.rules.label(ns)
        rows.append(
            {
                "namespace": ns,
                "used_bytes": size,
                "artifacts": entries,
                "rule": _rule(a.rules, ns),
                "shed_age_youngest_seconds": _finite(
                    a.stats.shed_ages.quantile_seconds(label, YOUNGEST)
                ),
                "shed_age_median_seconds": _finite(a.stats.shed_ages.quantile_seconds(label, 0.5)),
            }
        )
    return web.json_response({"namespaces": rows, "measured_at": _at(measured)})


@endpoint(PROTOCOL, Access.CLEAN, namespace=_namespace)
async def list_writers(request: web.Request) -> web.StreamResponse:
    ns = _namespace(request)
    writers = await _admin(request).provenance.writers(ns)
    if not writers:
        raise NotFound(f"namespace {ns!r} holds no entry on this node")
    return web.json_response(
        {
            "namespace": ns,
            "writers": [
                {
                    "writer": w.writer,
                    "entries": w.entries,
                    "bytes": w.bytes,
                    "last_version_at": _at(w.last_version_ms),
                    "vias": list(w.vias),
                }
                for w in writers
            ],
        }
    )


def _entry(m: Manifest) -> dict[str, Any]:
    return {
        "artifact_id": m.artifact_id,
        "producer": m.producer,
        "key": m.key,
        "size_bytes": m.size,
        "content_type": m.content_type,
        "sha256": m.sha256,
        "version_at": _at(m.version_ms),
        "created_at": _at(m.created_at_ms),
    }


@endpoint(PROTOCOL, Access.CLEAN, namespace=_namespace)
async def list_entries(request: web.Request) -> web.StreamResponse:
    ns, writer, limit = _namespace(request), _writer(request), _limit(request)
    found = await _admin(request).provenance.written_by(ns, writer, limit)
    if not found:
        raise NotFound(f"writer {writer!r} holds no entry in namespace {ns!r} on this node")
    return web.json_response(
        {"namespace": ns, "writer": writer, "entries": [_entry(m) for m in found]}
    )


@endpoint(PROTOCOL, Access.CLEAN, namespace=_namespace)
async def purge(request: web.Request) -> web.StreamResponse:
    """Every entry ``writer`` wrote in the namespace, deleted on every node. Recorded and
    replicated even when the writer holds no entry here (``entries`` 0): its entries may sit
    on a peer only, not replicated yet, or evicted here, and the purge must still reach them
    and block their late copies."""
    ns, writer = _namespace(request), _writer(request)
    done = await _admin(request).writer.purge_writer(ns, writer)
    return web.json_response(
        {
            "namespace": ns,
            "writer": writer,
            "version_ms": done.version_ms,
            "entries": done.entries,
            "bytes": done.bytes,
        }
    )


def routes() -> list[web.RouteDef]:
    return [
        web.get("/_admin/namespaces", list_namespaces),
        web.get("/_admin/writers", list_writers),
        web.get("/_admin/entries", list_entries),
        web.post("/_admin/purge", purge),
    ]
