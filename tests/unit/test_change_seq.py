"""The change sequence (``storage.change_seq``) and the feed read (``storage.change_feed``) on
real SQLite files: every upsert and tombstone takes the next number in its own transaction,
numbers are never reused after a delete, a page is in change order, and a schema-2 index is
migrated in place with its rows numbered (tombstones first) and a new epoch."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

from kura.core.manifest import Manifest
from kura.storage import change_feed, change_seq
from kura.storage.index import SCHEMA_VERSION, MetadataIndex


def manifest(n: int, version_ms: int, namespace_id: str = "ns") -> Manifest:
    return Manifest(
        artifact_id=hashlib.sha256(f"{namespace_id}/{n}".encode()).hexdigest(),
        producer="http_cache",
        namespace_id=namespace_id,
        key=f"k{n}",
        content_type="application/octet-stream",
        size=3,
        sha256=hashlib.sha256(b"abc").hexdigest(),
        version_ms=version_ms,
        created_at_ms=1,
    )


def seqs(db: Path, table: str, key: str) -> dict[str, int]:
    conn = sqlite3.connect(db)
    try:
        return {str(k): int(s) for k, s in conn.execute(f"SELECT {key}, seq FROM {table}")}
    finally:
        conn.close()


def test_every_change_takes_the_next_number_and_a_deleted_number_is_never_reused(
    tmp_path: Path,
) -> None:
    index = MetadataIndex(tmp_path / "index.sqlite3")
    conn = index.connection()
    epoch, head = change_seq.head(conn)
    assert (len(epoch), head) == (32, 0)
    a, b = manifest(1, 10), manifest(2, 11)
    index.upsert(a, b"abc", None, 1)
    index.upsert(b, b"abc", None, 1)
    index.upsert(manifest(1, 12), b"abc", None, 1)  # a changed again: a new number
    assert seqs(tmp_path / "index.sqlite3", "artifacts", "artifact_id") == {
        a.artifact_id: 3,
        b.artifact_id: 2,
    }
    index.delete([a.artifact_id])  # an eviction is no change of the sequence
    assert change_seq.head(conn) == (epoch, 3)
    index.upsert(manifest(3, 13), b"abc", None, 1)
    assert change_seq.head(conn) == (epoch, 4)  # not 3 again
    assert index.apply_tombstone("other", 50, 1) == []
    assert seqs(tmp_path / "index.sqlite3", "tombstones", "namespace_id") == {"other": 5}
    assert index.apply_tombstone("other", 40, 1) is None  # older: nothing changes
    assert change_seq.head(conn) == (epoch, 5)


def test_a_failed_transaction_takes_no_number(tmp_path: Path) -> None:
    index = MetadataIndex(tmp_path / "index.sqlite3")
    bad = manifest(1, 10)
    object.__setattr__(bad, "headers", {"x": object()})  # json.dumps fails mid-transaction
    try:
        index.upsert(bad, None, None, 1)
    except TypeError:
        pass
    else:
        raise AssertionError("the upsert should have failed")
    assert change_seq.head(index.connection())[1] == 0
    index.upsert(manifest(2, 10), None, None, 1)
    assert change_seq.head(index.connection())[1] == 1


def test_a_page_is_in_change_order_and_pages_cover_every_change_once(tmp_path: Path) -> None:
    index = MetadataIndex(tmp_path / "index.sqlite3")
    written = []
    for n in range(7):
        m = manifest(n, 100 + n)
        index.upsert(m, b"abc", None, 1)
        written.append(("a", m.artifact_id))
        if n == 3:
            index.apply_tombstone("gone", 5, 1)
            written.append(("t", "gone"))
    conn = index.connection()
    seen: list[tuple[str, str]] = []
    since, pages = 0, 0
    while True:
        page = change_feed.read_page(conn, since, 3)
        pages += 1
        seen += [("t", t[0]) for t in page.tombstones] + [
            ("a", m.artifact_id) for m in page.manifests
        ]
        if not page.more:
            break
        assert page.next_since > since
        since = page.next_since
    assert sorted(seen) == sorted(written)
    assert pages == 3
    assert page.next_since == page.head_seq == 8
    # The tombstone (number 5) is on the page of numbers 4-6, between its neighbours.
    middle = change_feed.read_page(conn, 3, 3)
    assert middle.tombstones == [("gone", 5)]
    assert [m.key for m in middle.manifests] == ["k3", "k4"]
    # From the head: an empty page that says so.
    last = change_feed.read_page(conn, 8, 3)
    assert (last.tombstones, last.manifests, last.more, last.next_since) == ([], [], False, 8)


V2_SCHEMA = """
CREATE TABLE meta (k TEXT PRIMARY KEY, v TEXT NOT NULL);
CREATE TABLE artifacts (
    artifact_id TEXT PRIMARY KEY, producer TEXT NOT NULL, namespace_id TEXT NOT NULL,
    key TEXT NOT NULL, content_type TEXT NOT NULL, size INTEGER NOT NULL, sha256 TEXT NOT NULL,
    version_ms INTEGER NOT NULL, created_at_ms INTEGER NOT NULL, last_access_ms INTEGER NOT NULL,
    inline_body BLOB, headers TEXT NOT NULL DEFAULT '{}', stat_sig TEXT, xxh3_128 TEXT
);
CREATE TABLE tombstones (namespace_id TEXT PRIMARY KEY, version_ms INTEGER NOT NULL);
INSERT INTO meta(k, v) VALUES ('schema_version', '2');
"""


def test_a_schema_2_index_is_migrated_with_every_row_numbered_tombstones_first(
    tmp_path: Path,
) -> None:
    db = tmp_path / "index.sqlite3"
    conn = sqlite3.connect(db)
    conn.executescript(V2_SCHEMA)
    rows = [manifest(n, 1000 - n) for n in range(5)]  # inserted newest first
    for m in rows:
        conn.execute(
            "INSERT INTO artifacts VALUES (?,?,?,?,?,?,?,?,?,?,NULL,'{}',NULL,NULL)",
            (m.artifact_id, m.producer, m.namespace_id, m.key, m.content_type, m.size,
             m.sha256, m.version_ms, m.created_at_ms, 1),
        )  # fmt: skip
    conn.execute("INSERT INTO tombstones VALUES ('t1', 7), ('t0', 9)")
    conn.commit()
    conn.close()
    index = MetadataIndex(db)
    c = index.connection()
    assert c.execute("SELECT v FROM meta WHERE k = 'schema_version'").fetchone() == (
        str(SCHEMA_VERSION),
    )
    assert seqs(db, "tombstones", "namespace_id") == {"t1": 1, "t0": 2}  # by version
    by_version = sorted(rows, key=lambda m: m.version_ms)
    assert seqs(db, "artifacts", "artifact_id") == {
        m.artifact_id: 3 + i for i, m in enumerate(by_version)
    }
    epoch, head = change_seq.head(c)
    assert (len(epoch), head) == (32, 7)
    # Every row is on the feed, and the counter goes on after them.
    page = change_feed.read_page(c, 0, 100)
    assert page.tombstones == [("t1", 7), ("t0", 9)]
    assert page.manifests == by_version
    index.upsert(manifest(9, 5), None, None, 1)
    assert change_seq.head(c) == (epoch, 8)
    # A second open migrates nothing again: same epoch, same numbers.
    index.close_thread_connection()
    again = MetadataIndex(db)
    assert change_seq.head(again.connection()) == (epoch, 8)


def test_a_new_index_has_its_own_epoch(tmp_path: Path) -> None:
    one = change_seq.head(MetadataIndex(tmp_path / "a.sqlite3").connection())[0]
    two = change_seq.head(MetadataIndex(tmp_path / "b.sqlite3").connection())[0]
    assert one != two


def test_a_peer_cursor_is_durable(tmp_path: Path) -> None:
    db = tmp_path / "index.sqlite3"
    index = MetadataIndex(db)
    assert change_feed.load_cursor(index.connection(), "http://p") is None
    change_feed.store_cursor(index.connection(), "http://p", "e1", 42, 1)
    index.close_thread_connection()
    again = MetadataIndex(db)
    assert change_feed.load_cursor(again.connection(), "http://p") == change_feed.PeerCursor(
        "http://p", "e1", 42
    )
