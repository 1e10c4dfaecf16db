"""The two digests of a stored body (``storage.checksum``) are over exactly the same bytes on
every path that produces them: ``stage_body`` (uploads, replicas, bootstrap), ``concatenate``
(multipart completion) and ``digest_fd`` (what a GET checks while sending), for any body and
any way it arrives in chunks; and the index migrates a schema-1 file in place (real SQLite
files, real staging files)."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import os
import sqlite3
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from kura.core.manifest import Manifest
from kura.storage.blobs import Staged, concatenate, stage_body
from kura.storage.budget import TmpBudget
from kura.storage.checksum import SHA256, XXH3_128, BodyDigests, new_hasher, xxh3_128_hex
from kura.storage.index import SCHEMA_VERSION, MetadataIndex
from kura.storage.verify import HASH_CHUNK_BYTES, digest_fd

BODIES = st.binary(max_size=4096) | st.integers(0, 2 * HASH_CHUNK_BYTES + 7).map(os.urandom)
CUTS = st.lists(st.integers(0, 2 * HASH_CHUNK_BYTES + 7), max_size=6)


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    at = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(at)] or [b""]


def expected(data: bytes) -> tuple[str, str]:
    return hashlib.sha256(data).hexdigest(), xxhash.xxh3_128(data).hexdigest()


async def _chunks(parts: list[bytes]) -> AsyncIterator[bytes]:
    for p in parts:
        yield p


async def _stage(parts: list[bytes], path: Path, size: int) -> Staged:
    budget = TmpBudget(64 * HASH_CHUNK_BYTES)
    with budget.try_reserve(max(size, 1)) as reservation:
        return await stage_body(
            _chunks(parts), path, reservation, limit_bytes=size, declared_length=size
        )


@settings(max_examples=30, deadline=None)
@given(data=BODIES, cuts=CUTS)
def test_every_producer_digests_exactly_the_bytes_it_wrote(data: bytes, cuts: list[int]) -> None:
    parts = split(data, cuts)
    want = expected(data)
    digests = BodyDigests()
    for p in parts:
        digests.update(p)
    assert (digests.sha256, digests.xxh3_128) == want
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        staged = asyncio.run(_stage(parts, d / "upload", len(data)))
        assert staged.size == len(data)
        assert (d / "upload").read_bytes() == data
        assert (staged.sha256, staged.xxh3_128) == want
        for i, p in enumerate(parts):
            (d / f"part-{i}").write_bytes(p)
        joined = concatenate([d / f"part-{i}" for i in range(len(parts))], d / "joined")
        assert (d / "joined").read_bytes() == data
        assert (joined.size, joined.sha256, joined.xxh3_128) == (len(data), *want)
        tail = min(len(data), 64 * 1024)
        fd = os.open(d / "joined", os.O_RDONLY)
        read = digest_fd(fd, len(data), tail, (SHA256, XXH3_128))
        assert (read.digests[SHA256], read.digests[XXH3_128]) == want
        assert read.tail == data[len(data) - tail :]
        assert xxh3_128_hex(data) == want[1]


def test_a_flipped_bit_changes_the_fast_checksum() -> None:
    data = bytearray(os.urandom(3 * HASH_CHUNK_BYTES))
    before = xxh3_128_hex(bytes(data))
    for at in (0, HASH_CHUNK_BYTES - 1, len(data) - 1):
        data[at] ^= 0x01
        assert xxh3_128_hex(bytes(data)) != before
        data[at] ^= 0x01


def test_an_unknown_algorithm_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown digest algorithm"):
        new_hasher("md5")


# -- the index: schema 1 -> 2 in place ----------------------------------------------------------

V1_ARTIFACTS = """
CREATE TABLE meta (k TEXT PRIMARY KEY, v TEXT NOT NULL);
CREATE TABLE artifacts (
    artifact_id TEXT PRIMARY KEY, producer TEXT NOT NULL, namespace_id TEXT NOT NULL,
    key TEXT NOT NULL, content_type TEXT NOT NULL, size INTEGER NOT NULL, sha256 TEXT NOT NULL,
    version_ms INTEGER NOT NULL, created_at_ms INTEGER NOT NULL, last_access_ms INTEGER NOT NULL,
    inline_body BLOB, headers TEXT NOT NULL DEFAULT '{}', stat_sig TEXT
);
INSERT INTO meta(k, v) VALUES ('schema_version', '1');
"""


def manifest(aid: str, data: bytes, version_ms: int = 7) -> Manifest:
    return Manifest(
        artifact_id=aid,
        producer="http_cache",
        namespace_id="ns",
        key="k",
        content_type="application/octet-stream",
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        version_ms=version_ms,
        created_at_ms=1,
    )


def schema_1_file(path: Path, m: Manifest) -> None:
    conn = sqlite3.connect(path)
    conn.executescript(V1_ARTIFACTS)
    conn.execute(
        "INSERT INTO artifacts VALUES (?,?,?,?,?,?,?,?,?,?,NULL,'{}','1:2:3')",
        (m.artifact_id, m.producer, m.namespace_id, m.key, m.content_type, m.size, m.sha256,
         m.version_ms, m.created_at_ms, 1),
    )  # fmt: skip
    conn.commit()
    conn.close()


def test_a_schema_1_index_is_migrated_in_place_keeping_its_rows(tmp_path: Path) -> None:
    data = b"old bytes"
    old = manifest("a" * 64, data)
    db = tmp_path / "index.sqlite3"
    schema_1_file(db, old)
    # Read-only (a full disk at start-up) reads it as it is: every row without a checksum.
    ro = MetadataIndex(db, read_only=True)
    assert ro.get(old.artifact_id) == (old, None, "1:2:3", None)
    ro.close_thread_connection()
    index = MetadataIndex(db)
    assert index.get(old.artifact_id) == (old, None, "1:2:3", None)
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT v FROM meta").fetchone() == (str(SCHEMA_VERSION),)
    # The checksum recorded after a SHA-256 verification lands only on that very version.
    index.set_xxh3_128([(manifest(old.artifact_id, data, version_ms=8), "f" * 32)])
    assert index.get(old.artifact_id) == (old, None, "1:2:3", None)
    index.set_xxh3_128([(old, xxh3_128_hex(data))])
    assert index.get(old.artifact_id) == (old, None, "1:2:3", xxh3_128_hex(data))
    index.set_xxh3_128([(old, "f" * 32)])  # never overwrites one already recorded
    assert index.get(old.artifact_id) == (old, None, "1:2:3", xxh3_128_hex(data))
    new = manifest("b" * 64, b"new bytes")
    index.upsert(new, None, "4:5:6", 2, xxh3_128=xxh3_128_hex(b"new bytes"))
    assert index.get(new.artifact_id) == (new, None, "4:5:6", xxh3_128_hex(b"new bytes"))
    index.close_thread_connection()
    # A second open finds schema 2 and changes nothing.
    again = MetadataIndex(db)
    assert again.get(new.artifact_id) == (new, None, "4:5:6", xxh3_128_hex(b"new bytes"))
    assert conn.execute("SELECT COUNT(*) FROM artifacts").fetchone() == (2,)
    conn.close()
