"""``storage.schema.write_transaction``, the one write transaction of storage (issue 27 item 6):
it takes the write lock at once, commits when the block ends, and rolls back on any error."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from kura.storage.schema import write_transaction


@pytest.fixture
def db(tmp_path: Path) -> Iterator[tuple[sqlite3.Connection, sqlite3.Connection]]:
    path = tmp_path / "t.sqlite"
    first = sqlite3.connect(path, isolation_level=None, timeout=0)
    second = sqlite3.connect(path, isolation_level=None, timeout=0)
    first.execute("PRAGMA journal_mode=WAL")
    first.execute("CREATE TABLE t (v INTEGER)")
    yield first, second
    first.close()
    second.close()


def test_a_block_commits_when_it_ends_and_holds_the_write_lock_from_its_start(
    db: tuple[sqlite3.Connection, sqlite3.Connection],
) -> None:
    first, second = db
    with write_transaction(first) as conn:
        assert conn is first
        assert conn.in_transaction  # before any write: BEGIN IMMEDIATE, not deferred
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            second.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO t VALUES (1)")
    assert not first.in_transaction
    assert second.execute("SELECT v FROM t").fetchall() == [(1,)]


def test_an_error_in_the_block_rolls_back_and_is_raised_unchanged(
    db: tuple[sqlite3.Connection, sqlite3.Connection],
) -> None:
    first, second = db

    def failing_write() -> None:
        with write_transaction(first):
            first.execute("INSERT INTO t VALUES (1)")
            raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        failing_write()
    assert not first.in_transaction
    assert second.execute("SELECT COUNT(*) FROM t").fetchone() == (0,)
    with write_transaction(second):  # the lock was released
        second.execute("INSERT INTO t VALUES (2)")
    assert first.execute("SELECT v FROM t").fetchall() == [(2,)]
