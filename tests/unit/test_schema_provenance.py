"""Schema version 4 (provenance, issue 29 item 4) on real SQLite files: every row records its
manifest's writer and how the copy came (``via``), every manifest read from the index carries
the writer on (gets, pages, the change feed), and a version-3 file is migrated in place without
renumbering its change feed, or read as it is (every writer ``''``) when opened read-only."""

from __future__ import annotations

import dataclasses
import sqlite3
from pathlib import Path

from kura.storage import change_feed, change_seq
from kura.storage.index import SCHEMA_VERSION, MetadataIndex
from tests.unit.test_change_seq import manifest


def _columns(db: Path) -> set[str]:
    conn = sqlite3.connect(db)
    try:
        return {str(r[1]) for r in conn.execute("PRAGMA table_info(artifacts)")}
    finally:
        conn.close()


def test_every_read_of_the_index_carries_the_writer_and_via_is_recorded(tmp_path: Path) -> None:
    index = MetadataIndex(tmp_path / "index.sqlite3")
    evil = dataclasses.replace(manifest(1, 10), writer="token:evil")
    good = dataclasses.replace(manifest(2, 11), writer="jwt:alice")
    index.upsert(evil, b"abc", None, 1)
    index.upsert(good, b"abc", None, 1, via="replication")
    got = index.get(evil.artifact_id)
    assert got is not None
    assert got[0].writer == "token:evil"
    assert got[1] == b"abc"
    assert {r[0].writer for r in index.get_many([evil.artifact_id, good.artifact_id]).values()} == {
        "token:evil",
        "jwt:alice",
    }
    assert [m.writer for m in index.paging.manifests_newest(None, 10)] == [
        "jwt:alice",
        "token:evil",
    ]
    assert {m.writer for m in index.paging.manifests_after(None, 10)} == {"token:evil", "jwt:alice"}
    page = change_feed.read_page(index.connection(), 0, 10)
    assert [m.writer for m in page.manifests] == ["token:evil", "jwt:alice"]
    vias = dict(index.connection().execute("SELECT writer, via FROM artifacts"))
    assert vias == {"token:evil": "", "jwt:alice": "replication"}
    index.close_all()


def _as_version_3(db: Path) -> None:
    """Make ``db`` what a version-3 kura left: no provenance columns, no purge table."""
    conn = sqlite3.connect(db)
    try:
        with conn:
            conn.execute("ALTER TABLE artifacts DROP COLUMN writer")
            conn.execute("ALTER TABLE artifacts DROP COLUMN via")
            conn.execute("DROP TABLE purges")
            conn.execute("UPDATE meta SET v = '3' WHERE k = 'schema_version'")
    finally:
        conn.close()


def test_a_version_3_index_reads_read_only_and_migrates_in_place_keeping_its_feed(
    tmp_path: Path,
) -> None:
    db = tmp_path / "index.sqlite3"
    index = MetadataIndex(db)
    old = manifest(1, 10)
    index.upsert(old, b"abc", None, 1)
    epoch, head = change_seq.head(index.connection())
    index.close_all()
    _as_version_3(db)
    assert "writer" not in _columns(db)

    read_only = MetadataIndex(db, read_only=True)  # a full disk at start-up: cannot migrate
    got = read_only.get(old.artifact_id)
    assert got is not None
    assert got[0].writer == ""
    assert got[1] == b"abc"
    assert [m.writer for m in read_only.paging.manifests_newest(None, 10)] == [""]
    read_only.close_all()

    migrated = MetadataIndex(db)
    assert {"writer", "via"} <= _columns(db)
    conn = migrated.connection()
    version = conn.execute("SELECT v FROM meta WHERE k = 'schema_version'").fetchone()
    assert version == (str(SCHEMA_VERSION),) == ("4",)
    # Version 3 to 4 adds columns only: the feed keeps its epoch and numbers (peers' cursors).
    assert change_seq.head(conn) == (epoch, head)
    got = migrated.get(old.artifact_id)
    assert got is not None
    assert got[0].writer == ""
    new = dataclasses.replace(manifest(2, 12), writer="token:ci-main")
    migrated.upsert(new, b"abc", None, 2)
    assert [m.writer for m in migrated.paging.manifests_newest(None, 10)] == ["token:ci-main", ""]
    migrated.close_all()
