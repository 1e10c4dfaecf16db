"""The index queries of provenance (issue 29 item 4): who wrote what in a namespace
(``artifacts.writer``, schema version 4), and the purges of one writer's entries (table
``purges``, one row per (namespace, writer) holding the latest purge's version; written by
``storage.index.MetadataIndex.apply_purge``, which holds them all in memory).

Each query scans the namespace's rows through ``artifacts_by_namespace`` (no index on the
writer: a write pays nothing for provenance, an operator's question costs O(rows of the
namespace) on a reader thread). Every function takes the caller's connection.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping

from kura.core.errors import InsufficientStorage
from kura.core.manifest import Manifest
from kura.storage.artifact import WriterUsage
from kura.storage.schema import COLUMNS, row_to_manifest

LOCAL_VIA = "local"
# Bounds on the purges a node records (each is held in memory, and a local one is enqueued for
# every peer; one is recorded even when nothing matches it, as the writer's entries may sit on
# a peer only). Without them a caller with ``clean`` could add rows without limit by naming
# writers that never wrote. A local purge of a new (namespace, writer) pair is refused past
# either bound; both count every recorded purge, those applied from peers too (the table does
# not say where a purge came from), and a peer's purge is applied past them, so that the mesh
# agrees. The one per namespace keeps a credential limited to one namespace from using up the
# node's whole room: it fills only its own namespace's. A namespace clean drops the purges it
# covers (``drop_covered``).
MAX_PURGES_PER_NAMESPACE = 1_000
MAX_RECORDED_PURGES = 10_000


def load_purges(conn: sqlite3.Connection) -> dict[tuple[str, str], int]:
    """Every purge recorded, (namespace, writer) -> version (empty on a file without the
    table: older than schema version 4, opened read-only)."""
    try:
        rows = conn.execute("SELECT namespace_id, writer, version_ms FROM purges").fetchall()
    except sqlite3.OperationalError:
        return {}
    return {(str(ns), str(w)): int(v) for ns, w, v in rows}


def check_room(purges: Mapping[tuple[str, str], int], namespace_id: str, writer: str) -> None:
    """Before a local purge: ``InsufficientStorage`` (507) when ``purges`` (the node's
    recorded purges) holds none of ``writer`` in ``namespace_id`` (purging again replaces that
    row) and already ``MAX_PURGES_PER_NAMESPACE`` in that namespace or ``MAX_RECORDED_PURGES``
    in all."""
    if (namespace_id, writer) in purges:
        return
    here = sum(1 for ns, _w in purges if ns == namespace_id)
    if here >= MAX_PURGES_PER_NAMESPACE:
        raise InsufficientStorage(
            f"namespace {namespace_id!r} has {here} recorded purges, the most one namespace "
            f"keeps ({MAX_PURGES_PER_NAMESPACE}); a clean of the namespace drops them "
            f"({clean_route(namespace_id)}), and purging a writer already purged there is "
            "allowed"
        )
    if len(purges) >= MAX_RECORDED_PURGES:
        raise InsufficientStorage(
            f"this node has recorded {len(purges)} purges, the most it keeps "
            f"({MAX_RECORDED_PURGES}, those applied from peers included); a namespace clean "
            "drops the purges recorded in that namespace (DELETE /ns/<namespace>/cache; "
            "DELETE /cache for the default one), and purging a writer already purged there "
            "is allowed"
        )


def clean_route(namespace_id: str) -> str:
    """The HTTP request that cleans ``namespace_id`` (the default one, "", has no /ns/ path)."""
    return "DELETE /cache" if namespace_id == "" else f"DELETE /ns/{namespace_id}/cache"


def drop_covered(conn: sqlite3.Connection, namespace_id: str, version_ms: int) -> None:
    """Inside the caller's transaction (a namespace tombstone raised to ``version_ms``): delete
    the namespace's purges at or below it, which the tombstone covers (every copy at or
    below ``version_ms`` is ignored anyway)."""
    conn.execute(
        "DELETE FROM purges WHERE namespace_id = ? AND version_ms <= ?", (namespace_id, version_ms)
    )


def apply_purge(
    conn: sqlite3.Connection, namespace_id: str, writer: str, version_ms: int
) -> list[tuple[str, int, bool]] | None:
    """Inside the caller's transaction: record the purge and return the rows it covers,
    (artifact_id, size, inline), for the caller to delete; None (nothing recorded) when a purge
    of ``writer`` in ``namespace_id`` at or above ``version_ms`` exists already, or the
    namespace's tombstone is at or above it (it covers the purge: ``drop_covered``)."""
    row = conn.execute(
        "SELECT MAX(version_ms) FROM (SELECT version_ms FROM purges WHERE namespace_id = ? "
        "AND writer = ? UNION ALL SELECT version_ms FROM tombstones WHERE namespace_id = ?)",
        (namespace_id, writer, namespace_id),
    ).fetchone()
    if row[0] is not None and int(row[0]) >= version_ms:
        return None
    conn.execute(
        "INSERT OR REPLACE INTO purges(namespace_id, writer, version_ms) VALUES (?, ?, ?)",
        (namespace_id, writer, version_ms),
    )
    return [
        (str(r[0]), int(r[1]), bool(r[2]))
        for r in conn.execute(
            "SELECT artifact_id, size, length(inline_body) IS NOT NULL FROM artifacts "
            "WHERE namespace_id = ? AND COALESCE(writer, '') = ? AND version_ms <= ?",
            (namespace_id, writer, version_ms),
        )
    ]


def writers(conn: sqlite3.Connection, namespace_id: str) -> list[WriterUsage]:
    """Every writer with an entry in ``namespace_id``, most bytes first (ties by writer)."""
    totals: dict[str, tuple[int, int, int]] = {}
    vias: dict[str, set[str]] = {}
    for writer, via, entries, size, last in conn.execute(
        "SELECT COALESCE(writer, ''), COALESCE(via, ''), COUNT(*), COALESCE(SUM(size), 0), "
        "MAX(version_ms) FROM artifacts WHERE namespace_id = ? GROUP BY 1, 2",
        (namespace_id,),
    ):
        e, b, v = totals.get(str(writer), (0, 0, 0))
        totals[str(writer)] = (e + int(entries), b + int(size), max(v, int(last)))
        vias.setdefault(str(writer), set()).add(str(via) or LOCAL_VIA)
    usage = [WriterUsage(w, e, b, v, tuple(sorted(vias[w]))) for w, (e, b, v) in totals.items()]
    return sorted(usage, key=lambda u: (-u.bytes, u.writer))


def written_by(
    conn: sqlite3.Connection, namespace_id: str, writer: str, limit: int
) -> list[Manifest]:
    """The manifests ``writer`` wrote in ``namespace_id``, newest version first, at most
    ``limit``."""
    rows = conn.execute(
        f"SELECT {COLUMNS} FROM artifacts WHERE namespace_id = ? AND COALESCE(writer, '') = ? "
        "ORDER BY version_ms DESC, artifact_id LIMIT ?",
        (namespace_id, writer, limit),
    ).fetchall()
    return [row_to_manifest(r) for r in rows]
