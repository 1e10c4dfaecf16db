"""Paging queries of the metadata index: manifests and tombstones in cursor order, for peers
(bootstrap, catch-up) and the scrub, and artifacts in eviction order (``storage.eviction``).
A part of ``storage.index.MetadataIndex`` (``MetadataIndex.paging``), with the same rules: read-only, blocking, one
connection per thread.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import NamedTuple, cast

from kura.core.manifest import Manifest
from kura.core.object_layout import OUTBOX_TARGET
from kura.storage.namespace_usage import Protected, protect_clause
from kura.storage.retention import PROMISED_SINCE, UNPROMISED_SINCE
from kura.storage.schema import COLUMNS as _COLUMNS
from kura.storage.schema import row_to_manifest as _row_to_manifest

# (artifact_id, version_ms, sha256, inline: 0 or 1) of a row: ``current_versions_after``.
CurrentVersion = tuple[str, int, str, int]


class Victim(NamedTuple):
    """An artifact eviction or expiry may drop: its id, size in bytes, whether its body is
    inline in the index, its namespace and its last use (unix ms)."""

    artifact_id: str
    size: int
    inline: bool
    namespace_id: str
    last_access_ms: int


def _cursor(column: str, after: str | None) -> tuple[str, tuple[str, ...]]:
    """The WHERE clause of a cursor page. None starts at the first row: ``""`` cannot mean
    "from the start" because it is a real key (the tenant-wide namespace), which a ``> ''``
    first page skipped."""
    return ("1", ()) if after is None else (f"{column} > ?", (after,))


class PagingQueries:
    """The paging part of ``MetadataIndex`` (``_conn`` is the index's per-thread connection)."""

    def __init__(self, conn: Callable[[], sqlite3.Connection]) -> None:
        self._conn = conn  # the index's connection of the calling thread

    def manifests_after(self, after: str | None, limit: int) -> list[Manifest]:
        """Manifests with artifact_id > ``after`` (every one when ``after`` is None), in
        artifact_id order, at most ``limit``."""
        where, args = _cursor("artifact_id", after)
        rows = (
            self._conn()
            .execute(
                f"SELECT {_COLUMNS} FROM artifacts WHERE {where} ORDER BY artifact_id LIMIT ?",
                (*args, limit),
            )
            .fetchall()
        )
        return [_row_to_manifest(r) for r in rows]

    def current_versions_after(self, after: str | None, limit: int) -> list[CurrentVersion]:
        """What start-up reconciliation needs of each row (``storage.reconcile``), with
        artifact_id > ``after`` (every one when ``after`` is None), in artifact_id order, at
        most ``limit``: no ``Manifest`` is built, and an inline body is not read (its length
        is in the row header)."""
        where, args = _cursor("artifact_id", after)
        rows = (
            self._conn()
            .execute(
                "SELECT artifact_id, version_ms, sha256, length(inline_body) IS NOT NULL "
                f"FROM artifacts WHERE {where} ORDER BY artifact_id LIMIT ?",
                (*args, limit),
            )
            .fetchall()
        )
        # SQLite returns TEXT, INTEGER, TEXT and 0/1 for these columns (schema): no per-row
        # conversion, which is most of the cost at a million rows.
        return cast("list[CurrentVersion]", rows)

    def manifests_newest(self, after: tuple[int, str] | None, limit: int) -> list[Manifest]:
        """At most ``limit`` manifests ordered by (version_ms descending, artifact_id), strictly
        after the cursor ``after = (version_ms, artifact_id)`` (None: from the newest).

        Two range seeks on ``artifacts_by_version`` (the rest of the cursor's version, then the
        older versions), so a page costs O(limit) however deep it is."""
        conn = self._conn()
        rows: list[tuple[object, ...]] = []
        args: tuple[int, ...] = ()
        if after is None:
            where = "1"
        else:
            version_ms, artifact_id = after
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM artifacts WHERE version_ms = ? AND artifact_id > ? "
                "ORDER BY version_ms DESC, artifact_id LIMIT ?",
                (version_ms, artifact_id, limit),
            ).fetchall()
            where, args = "version_ms < ?", (version_ms,)
        if len(rows) < limit:
            rows += conn.execute(
                f"SELECT {_COLUMNS} FROM artifacts WHERE {where} "
                "ORDER BY version_ms DESC, artifact_id LIMIT ?",
                (*args, limit - len(rows)),
            ).fetchall()
        return [_row_to_manifest(r) for r in rows]

    def tombstones_after(self, after: str | None, limit: int) -> list[tuple[str, int]]:
        """(namespace_id, version_ms) with namespace_id > ``after`` (every one when ``after`` is
        None, so the tenant-wide namespace ``""`` is on the first page), in namespace_id order,
        at most ``limit``."""
        where, args = _cursor("namespace_id", after)
        rows = (
            self._conn()
            .execute(
                f"SELECT namespace_id, version_ms FROM tombstones WHERE {where} "
                "ORDER BY namespace_id LIMIT ?",
                (*args, limit),
            )
            .fetchall()
        )
        return [(str(r[0]), int(r[1])) for r in rows]

    def least_recently_used(
        self,
        limit: int,
        exclude: str,
        used_before_ms: int | None = None,
        promised_since_ms: int | None = None,
        *,
        promised_only: bool = False,
        namespace: str | None = None,
        protect: Protected = (),
    ) -> list[Victim]:
        """Up to ``limit`` victims oldest by access (equal stamps: oldest version first),
        skipping ``exclude`` and, with ``used_before_ms``, every artifact last used (or
        written) at or after it; with ``promised_since_ms``, every artifact promised to a
        client at or after it (``storage.retention``), or, ``promised_only``, every other
        artifact; with ``namespace``, every other namespace's; and the young entries of
        ``protect`` (``namespace_usage.protected``: a rule's ``min_age``). An artifact whose
        upload to the object-storage tier is pending is never picked: its only copy is here."""
        before = (1 << 62) if used_before_ms is None else used_before_ms
        clause = PROMISED_SINCE if promised_only else UNPROMISED_SINCE
        promised = "" if promised_since_ms is None else f"AND {clause} "
        args: tuple[object, ...] = () if promised_since_ms is None else (promised_since_ms,)
        if namespace is not None:  # a seek on artifacts_by_namespace_access
            promised += "AND a.namespace_id = ? "
            args += (namespace,)
        young, young_args = protect_clause(protect)
        rows = (
            self._conn()
            .execute(
                # length(), not IS NOT NULL: SQLite reads a blob's length from the row header,
                # without walking an inline body's overflow pages (4x cheaper at 16 KiB).
                "SELECT artifact_id, size, length(inline_body) IS NOT NULL, namespace_id, "
                "last_access_ms FROM artifacts a "
                "WHERE artifact_id != ? AND last_access_ms < ? "
                "AND NOT EXISTS (SELECT 1 FROM outbox o "
                f"WHERE o.artifact_id = a.artifact_id AND o.peer = ?) {promised}{young}"
                "ORDER BY last_access_ms, version_ms, artifact_id LIMIT ?",
                (exclude, before, OUTBOX_TARGET, *args, *young_args, limit),
            )
            .fetchall()
        )
        return [Victim(str(r[0]), int(r[1]), bool(r[2]), str(r[3]), int(r[4])) for r in rows]
