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

Eviction (``storage.eviction``) then picks, in LRU order, only artifacts with no promise
younger than ``KURA_MIN_RETENTION``; only when those are not enough to stay within
``KURA_MAX_DISK_BYTES`` does it evict promised ones too (the budget and the durability of the new
write win), counts each in ``kura_retention_evictions_total`` and names the shortfall in the
``/ready`` warnings (``shortfall_warning``) until ``WARNING_SECONDS`` have passed without one.
Age expiry (``KURA_MAX_AGE``) never drops a promised artifact. Promises are local, like access
times: never replicated.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping

from kura.storage.schema import write_transaction

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

# Excludes from an eviction query (``paging.least_recently_used``) every artifact promised at or
# after its parameter (unix ms).
UNPROMISED_SINCE = (
    "NOT EXISTS (SELECT 1 FROM retention r WHERE r.artifact_id = a.artifact_id "
    "AND r.promised_ms >= ?)"
)


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


def shortfall_warning(
    evictions: int, evicted_bytes: int, last_ms: int, now_ms: int, min_retention_ms: int
) -> str | None:
    """The ``/ready`` warning while a promised artifact was evicted less than
    ``WARNING_SECONDS`` before ``now_ms`` (``last_ms``, unix ms; 0 = never), else None.
    ``evictions`` and ``evicted_bytes`` are the totals since start."""
    if not last_ms or now_ms - last_ms >= WARNING_SECONDS * 1000:
        return None
    return (
        f"retention floor not held: {evictions} artifact(s) ({evicted_bytes} bytes) that clients "
        f"were told exist were evicted inside KURA_MIN_RETENTION ({min_retention_ms // 1000} s) "
        f"to stay within KURA_MAX_DISK_BYTES, the last {(now_ms - last_ms) // 1000} s ago; "
        "builds without the bytes may fail with lost inputs: raise KURA_MAX_DISK_BYTES "
        "(docs/durability.md, retention)"
    )
