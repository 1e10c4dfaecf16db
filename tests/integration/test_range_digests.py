"""The anti-entropy range digests (``storage.digests``) stay equal to a rebuild from the rows,
whatever sequence of upserts (one by one, or many in one transaction), replacements, deletes (evictions) and tombstones a real SQLite
index goes through, and an index without them is back-filled at open."""

from __future__ import annotations

import sqlite3
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kura.core.keys import artifact_id
from kura.core.manifest import Manifest
from kura.storage import digests
from kura.storage.index import MetadataIndex

pytestmark = pytest.mark.in_process

KEYS = [f"k{i}" for i in range(8)]
NAMESPACES = ("a", "b")


def _manifest(ns: str, key: str, version_ms: int) -> Manifest:
    return Manifest(
        artifact_id=artifact_id("xcode", "t", ns, key),
        producer="xcode",
        namespace_id=ns,
        key=key,
        content_type="application/octet-stream",
        size=1,
        sha256=f"{version_ms:064x}",
        version_ms=version_ms,
        created_at_ms=version_ms,
        inline=True,
    )


def _all_levels(conn: sqlite3.Connection) -> dict[str, tuple[int, int]]:
    out = {}
    for p, n, h in digests.ranges(conn, "", 0) + digests.ranges(conn, "", 2):
        out[p] = (n, h)
    for p, _n, _h in digests.ranges(conn, "", 2):
        out.update({c: (n, h) for c, n, h in digests.ranges(conn, p, 2)})
    return out


def _rebuilt(conn: sqlite3.Connection) -> dict[str, tuple[int, int]]:
    conn.execute("DELETE FROM meta WHERE k = ?", (digests.BUILT_FLAG,))
    assert digests.ensure(conn) is True
    return _all_levels(conn)


ops = st.lists(
    st.tuples(
        st.sampled_from(["put", "batch", "delete", "clean"]),
        st.sampled_from(NAMESPACES),
        st.sampled_from(KEYS),
    ),
    max_size=60,
)


@settings(max_examples=40, deadline=None)
@given(ops)
def test_incremental_digests_equal_a_rebuild_after_any_changes(
    steps: list[tuple[str, str, str]],
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        index = MetadataIndex(Path(tmp) / "index.sqlite3")
        version = 1000
        for op, ns, key in steps:
            version += 1
            if op == "put":
                index.upsert(_manifest(ns, key, version), b"x", None, version)
            elif op == "batch":  # one transaction, the same key twice in it
                rows = [_manifest(ns, k, version) for k in (key, KEYS[0], key)]
                index.upsert_many([(m, b"x", None, None) for m in rows], version)
            elif op == "delete":
                index.delete([artifact_id("xcode", "t", ns, key)])
            else:
                index.apply_tombstone(ns, version, version)
        conn = index.connection()
        incremental = _all_levels(conn)
        count = int(conn.execute("SELECT COUNT(*) FROM artifacts").fetchone()[0])
        assert incremental.get("", (0, 0))[0] == count
        assert incremental == _rebuilt(conn)
        index.close_thread_connection()


def test_an_index_without_digests_is_back_filled_at_open(tmp_path: Path) -> None:
    path = tmp_path / "index.sqlite3"
    index = MetadataIndex(path)
    for i, key in enumerate(KEYS):
        index.upsert(_manifest("a", key, 2000 + i), b"x", None, 1)
    expected = _all_levels(index.connection())
    index.close_thread_connection()
    conn = sqlite3.connect(path)  # what an index written before digests looks like
    conn.execute("DROP TABLE ae_ranges")
    conn.execute("DELETE FROM meta WHERE k = ?", (digests.BUILT_FLAG,))
    conn.commit()
    conn.close()
    reopened = MetadataIndex(path)
    assert _all_levels(reopened.connection()) == expected
    assert expected[""][0] == len(KEYS)
    reopened.close_thread_connection()


def test_digests_written_behind_the_index_back_are_rebuilt_at_open(tmp_path: Path) -> None:
    """Rows deleted by a writer that does not keep the digests (an older kura) leave the root
    count wrong; the next open notices and rebuilds."""
    path = tmp_path / "index.sqlite3"
    index = MetadataIndex(path)
    for i, key in enumerate(KEYS):
        index.upsert(_manifest("a", key, 2000 + i), b"x", None, 1)
    index.close_thread_connection()
    conn = sqlite3.connect(path)
    conn.execute("DELETE FROM artifacts WHERE key IN ('k1', 'k2')")
    conn.commit()
    conn.close()
    reopened = MetadataIndex(path)
    got = _all_levels(reopened.connection())
    assert got[""][0] == len(KEYS) - 2
    assert got == _rebuilt(reopened.connection())
    reopened.close_thread_connection()
