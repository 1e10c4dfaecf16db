"""The retention floor (``KURA_MIN_RETENTION``): a blob a client was told exists stays at least
that long, while the disk budget allows.

Bazel's "build without the bytes" (``--remote_download_minimal``, ``toplevel``) does not
download a cached action's outputs; it assumes that a blob the cache said it has stays there for
``--experimental_remote_cache_ttl`` (3 h by default), and fetches it only when a later action
needs it as an input. A cache that evicts it meanwhile fails that build with "lost inputs"
(bazel issues #8250 and #18696). So every answer that tells a client "these blobs are stored"
(``ArtifactReader.missing``: a ``FindMissingBlobs`` answer, the completeness check of an
action-cache hit over gRPC and HTTP, a key-value hit's referenced blobs) records a *promise*:
artifact id -> when it was told (unix ms), in memory first (``state.AccessTimes.promise``), then
in the index's ``retention`` table, one statement per batch (``record``).

Eviction (``storage.eviction``) then picks, in LRU order, unpromised artifacts used before the
window first; then promises over ``PROMISE_SHARE`` of ``KURA_MAX_DISK_BYTES``; then unpromised
artifacts used inside the window; then, when nothing else is left, promised ones too (the budget
and the durability of the new write win). A broken promise is counted in
``kura_retention_evictions_total``; a young unpromised artifact evicted while promises hold over
``DISPLACING_SHARE`` in ``kura_retention_displaced_evictions_total`` (the promises crowd new
writes out: a read-only client's ``FindMissingBlobs`` over everything stored did, silently,
before). Both are named in the ``/ready`` warnings (``shortfall_warning``), with the promised
bytes (``promised_bytes``, also a gauge) and the budget, until ``WARNING_SECONDS`` have passed
without one.
Age expiry (``KURA_MAX_AGE``) never drops a promised artifact. Promises are local, like access
times: never replicated.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping

from kura.storage.schema import write_transaction
from kura.storage.stats import StorageStats

# The shortfall warning stays this long after the last promised artifact evicted: long enough
# for an operator (or an alert on /ready warnings) to see it, short enough that a passing
# burst does not latch it.
WARNING_SECONDS = 900

SCHEMA = """
CREATE TABLE IF NOT EXISTS retention (
    artifact_id TEXT PRIMARY KEY,
    promised_ms INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS retention_by_time ON retention(promised_ms);
"""

# Promises may hold at most this share of KURA_MAX_DISK_BYTES: past it, the least recently told
# give way (counted as forced evictions) before any blob written inside the window, so a client
# that asks about everything (a read-only token's FindMissingBlobs) cannot leave new writes no
# room. A quarter of the budget (5 eviction passes) stays for what is written meanwhile.
PROMISE_SHARE = 3 / 4
# A blob used inside the window that is evicted while promises hold more than this share of the
# budget was pushed out by them ("displaced", counted and warned): below it, new writes have at
# least as much room as the promises, an LRU the operator sized; above it, the disk is too small
# for what clients were told exists (docs/durability.md: budget >= 2 x promised bytes).
DISPLACING_SHARE = 1 / 2

# Excludes from an eviction query (``paging.least_recently_used``) every artifact promised at or
# after its parameter (unix ms); ``PROMISED_SINCE`` keeps only those.
PROMISED_SINCE = (
    "EXISTS (SELECT 1 FROM retention r WHERE r.artifact_id = a.artifact_id AND r.promised_ms >= ?)"
)
UNPROMISED_SINCE = f"NOT {PROMISED_SINCE}"


def ensure(conn: sqlite3.Connection) -> None:
    """Create the ``retention`` table if missing (outside the schema version, like the digests:
    an older kura opening the file ignores it)."""
    conn.executescript(SCHEMA)


def record(conn: sqlite3.Connection, promised: Mapping[str, int], expired_before_ms: int) -> None:
    """Writer thread: record ``promised`` (artifact id -> unix ms told), keeping the later time
    of each, in one statement (the ids travel as one JSON object, ``json_each``), and delete the
    promises made before ``expired_before_ms``, in one transaction. A promise may name an
    artifact that is gone: it only ever holds eviction back."""
    with write_transaction(conn):
        if promised:
            # "WHERE true": an upsert from a SELECT needs a WHERE (the ON parsing ambiguity,
            # https://www.sqlite.org/lang_upsert.html#parsing_ambiguity).
            conn.execute(
                "INSERT INTO retention (artifact_id, promised_ms) "
                "SELECT key, value FROM json_each(?) WHERE true "
                "ON CONFLICT(artifact_id) DO UPDATE "
                "SET promised_ms = MAX(promised_ms, excluded.promised_ms)",
                (json.dumps(promised),),
            )
        conn.execute("DELETE FROM retention WHERE promised_ms < ?", (expired_before_ms,))


def promised_bytes(conn: sqlite3.Connection, since_ms: int) -> int:
    """Bytes of the stored artifacts promised at or after ``since_ms`` (unix ms): one range scan
    of ``retention_by_time`` with a primary-key look-up each, so O(promises in the window); run
    by eviction passes and the promise flush, never per answer."""
    row = conn.execute(
        "SELECT COALESCE(SUM(a.size), 0) FROM retention r "
        "JOIN artifacts a ON a.artifact_id = r.artifact_id WHERE r.promised_ms >= ?",
        (since_ms,),
    ).fetchone()
    return int(row[0])


def shortfall_warning(
    stats: StorageStats, now_ms: int, min_retention_ms: int, budget: int
) -> str | None:
    """The ``/ready`` warning while an artifact clients were told exists (forced) or one used
    inside the window (displaced) was evicted less than ``WARNING_SECONDS`` before ``now_ms``
    (``stats.retention_last_eviction_ms``, unix ms; 0 = never), else None. The counts are the
    totals since start; ``budget`` is ``KURA_MAX_DISK_BYTES``."""
    s = stats
    last_ms = s.retention_last_eviction_ms
    if not last_ms or now_ms - last_ms >= WARNING_SECONDS * 1000:
        return None
    return (
        f"retention floor not held: {s.retention_evictions_total} artifact(s) "
        f"({s.retention_evicted_bytes_total} bytes) that clients were told exist, and "
        f"{s.retention_displaced_evictions_total} ({s.retention_displaced_bytes_total} bytes) "
        f"written or used inside KURA_MIN_RETENTION ({min_retention_ms // 1000} s) were evicted "
        f"because promises held {s.retention_promised_bytes} of KURA_MAX_DISK_BYTES={budget} "
        f"bytes, the last {(now_ms - last_ms) // 1000} s ago: the disk is too small for what "
        "clients were told exists, so builds without the bytes may fail with lost inputs and "
        "new blobs are not kept; raise KURA_MAX_DISK_BYTES to twice the promised bytes "
        "(docs/durability.md, retention)"
    )
