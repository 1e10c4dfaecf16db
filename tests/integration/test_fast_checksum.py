"""The fast checksum of a stored body (``storage.checksum``), against real node processes on a
real ext4 image: a blob written now carries its XXH3-128 in the index, a byte flipped below the
filesystem in it is caught by the XXH3 check while sending (never a 200 with wrong bytes), and a
row written before the checksum existed (schema 1) is still verified with SHA-256, then given
its checksum, so its next read is fast.
"""

from __future__ import annotations

import os
import sqlite3
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import xxhash

from tests.conftest import NodeProcess
from tests.e2e.mesh import wait_for
from tests.integration.ext4 import Ext4Image
from tests.integration.test_integrity import (
    corrupt,
    ext4,  # noqa: F401 - the fixture
    outcome,
    quarantined,
    spawn_on,
    stat_sig,
)

pytestmark = pytest.mark.in_process

MiB = 1024 * 1024


def checksums(node: NodeProcess) -> dict[str, str | None]:
    """{key: xxh3_128 column} of every row (read-only connection, WAL allows it)."""
    conn = sqlite3.connect(f"file:{node.data_dir / 'index.sqlite3'}?mode=ro", uri=True)
    try:
        return dict(conn.execute("SELECT key, xxh3_128 FROM artifacts").fetchall())
    finally:
        conn.close()


def to_schema_1(node: NodeProcess) -> None:
    """Turn a stopped node's index into what a kura before the checksum wrote (schema 1)."""
    conn = sqlite3.connect(node.data_dir / "index.sqlite3")
    conn.execute("ALTER TABLE artifacts DROP COLUMN xxh3_128")
    conn.execute("UPDATE meta SET v = '1' WHERE k = 'schema_version'")
    conn.commit()
    conn.close()


def aborts_in(log: str) -> list[str]:
    return [line for line in log.splitlines() if "aborted sending artifact" in line]


def blob_of(node: NodeProcess, body: bytes) -> Path:
    (path,) = [p for p in node.blob_files() if p.read_bytes() == body]
    return path


def flip_below(image: Ext4Image, path: Path, offset: int) -> None:
    before = stat_sig(path)
    image.flip_byte_below(path, offset)
    assert stat_sig(path) == before  # the node's view of the file is unchanged


def test_a_byte_flipped_below_a_blob_with_a_checksum_is_caught_by_the_xxh3_check(
    ext4: Ext4Image,  # noqa: F811
) -> None:
    body = os.urandom(3 * MiB)
    node = spawn_on(ext4, scrub_interval_seconds=0)
    try:
        with node.client() as c:
            assert c.put("/cache/fast/blob", content=body).status_code == 201
            assert c.get("/cache/fast/blob").content == body
        assert checksums(node) == {"fast/blob": xxhash.xxh3_128(body).hexdigest()}
        path = blob_of(node, body)
    finally:
        assert node.stop() == 0
    flip_below(ext4, path, 2 * MiB + 77)
    node = spawn_on(ext4, scrub_interval_seconds=0)
    try:
        url = node.url + "/cache/fast/blob"
        with ThreadPoolExecutor(8) as pool:
            seen = Counter(pool.map(lambda _i: outcome(url, body), range(24)))
        assert seen["wrong"] == 0, seen
        assert seen["ok"] == 0, seen
        assert seen["hung"] == 0, seen
        assert seen["aborted"] >= 1, seen
        assert seen["aborted"] + seen["miss"] == 24, seen
        assert wait_for(lambda: node.metric(corrupt("read")) == 1, timeout=30)
        log = node.log()
        # The fast check found it (every aborted send says so) ...
        assert all("the file hashes to xxh3_128" in line for line in aborts_in(log)), log
        assert aborts_in(log), log
        assert "quarantined artifact" in log  # ... and SHA-256 confirmed it before dropping
        assert node.index_rows() == 0
        (kept,) = quarantined(node)
        assert len(kept.read_bytes()) == len(body)
        assert kept.read_bytes() != body
    finally:
        assert node.stop() == 0


def test_rows_from_before_the_checksum_are_verified_with_sha256_then_given_one(
    ext4: Ext4Image,  # noqa: F811
) -> None:
    intact, damaged = os.urandom(2 * MiB), os.urandom(2 * MiB)
    node = spawn_on(ext4, scrub_interval_seconds=0)
    try:
        with node.client() as c:
            for key, body in (("intact", intact), ("damaged", damaged)):
                assert c.put(f"/cache/old/{key}", content=body).status_code == 201
                assert c.get(f"/cache/old/{key}").content == body
        path = blob_of(node, damaged)
    finally:
        assert node.stop() == 0
    to_schema_1(node)
    flip_below(ext4, path, MiB + 5)
    node = spawn_on(ext4, scrub_interval_seconds=0)
    try:
        assert checksums(node) == {"old/intact": None, "old/damaged": None}  # migrated in place
        assert outcome(node.url + "/cache/old/damaged", damaged) == "aborted"
        assert wait_for(lambda: node.metric(corrupt("read")) == 1, timeout=30)
        (abort,) = aborts_in(node.log())
        assert "the file hashes to sha256" in abort
        assert outcome(node.url + "/cache/old/intact", intact) == "ok"
        want = xxhash.xxh3_128(intact).hexdigest()
        assert wait_for(lambda: checksums(node) == {"old/intact": want}, timeout=30)
        assert outcome(node.url + "/cache/old/intact", intact) == "ok"
        path = blob_of(node, intact)
    finally:
        assert node.stop() == 0
    # The recorded checksum is the one the next read checks: damage now is caught by it.
    flip_below(ext4, path, 7)
    node = spawn_on(ext4, scrub_interval_seconds=0)
    try:
        assert outcome(node.url + "/cache/old/intact", intact) == "aborted"
        assert wait_for(lambda: node.metric(corrupt("read")) == 1, timeout=30)
        (abort,) = aborts_in(node.log())
        assert "the file hashes to xxh3_128" in abort
    finally:
        assert node.stop() == 0
