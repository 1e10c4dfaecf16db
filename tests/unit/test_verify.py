"""``storage.verify.digest_fd`` (the hash a large GET waits for before its last bytes), the block
digests a later range is checked against (``problem_with_blocks``, ``BlockDigests``) and
``storage.quarantine.Quarantine`` (bounded evidence), on real files.

digest_fd's tail is what the sender writes after the digest matched, so it must be exactly the
file's last bytes, for every size and tail length, and the digest must be the file's SHA-256.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import tempfile
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kura.core.manifest import Manifest
from kura.storage.checksum import SHA256
from kura.storage.quarantine import Quarantine
from kura.storage.verify import (
    HASH_CHUNK_BYTES,
    BlockDigests,
    DigestStopped,
    ReadVerifier,
    digest_fd,
    problem_with_blocks,
    problem_with_file,
)

SIZES = st.integers(0, 3 * HASH_CHUNK_BYTES + 17)


@settings(max_examples=40, deadline=None)
@given(
    size=SIZES,
    tail=st.integers(0, 2 * HASH_CHUNK_BYTES + 5),
    seed=st.binary(min_size=8, max_size=8),
)
def test_digest_fd_hashes_the_file_and_keeps_exactly_its_last_bytes(
    size: int, tail: int, seed: bytes
) -> None:
    tail = min(tail, size)
    data = (hashlib.sha256(seed).digest() * (size // 32 + 1))[:size]
    with tempfile.NamedTemporaryFile() as f:
        f.write(data)
        f.flush()
        d = digest_fd(os.dup(f.fileno()), size, tail)
    assert d.sha256 == hashlib.sha256(data).hexdigest()
    assert d.size_bytes == size
    assert d.tail == data[size - tail :]


def test_digest_fd_reports_a_file_shorter_than_promised(tmp_path: Path) -> None:
    path = tmp_path / "short"
    path.write_bytes(b"x" * 1000)
    d = digest_fd(os.open(path, os.O_RDONLY), 5000, 100)
    assert d.size_bytes == 1000


def manifest(aid: str, data: bytes) -> Manifest:
    return Manifest(
        artifact_id=aid,
        producer="http_cache",
        namespace_id="ns",
        key="k",
        content_type="application/octet-stream",
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        version_ms=1,
        created_at_ms=1,
        inline=False,
        headers={},
    )


def test_problem_with_file_names_size_and_digest_mismatches(tmp_path: Path) -> None:
    path = tmp_path / "blob"
    path.write_bytes(b"hello")
    assert problem_with_file(path, manifest("a" * 64, b"hello")) is None
    assert problem_with_file(path, manifest("a" * 64, b"hello!")) == "the file holds 5 bytes"
    found = problem_with_file(path, manifest("a" * 64, b"HELLO"))
    assert found == f"the file hashes to sha256 {hashlib.sha256(b'hello').hexdigest()}"
    assert problem_with_file(tmp_path / "gone", manifest("a" * 64, b"x")) == (
        "the blob file is missing"
    )


def test_the_quarantine_deletes_the_oldest_past_its_bound_and_counts_what_it_holds(
    tmp_path: Path,
) -> None:
    q = Quarantine(tmp_path / "q", max_bytes=250)
    q.open()
    for i in range(4):
        blob = tmp_path / f"blob{i}"
        blob.write_bytes(bytes([i]) * 100)
        q.admit(
            manifest(f"{i}" * 64, b"?" * 100),
            blob=blob,
            inline_body=None,
            found="the file hashes to sha256 ...",
            detected_by="scrub",
            now_ms=1000 + i,
        )
        assert not blob.exists()
    kept = sorted(p for p in (tmp_path / "q").iterdir() if p.suffix != ".json")
    assert [p.read_bytes()[0] for p in kept] == [2, 3]
    assert len(list((tmp_path / "q").glob("*.json"))) == 2
    assert q.size_bytes == 200
    reopened = Quarantine(tmp_path / "q", max_bytes=150)
    reopened.open()  # a smaller bound applies at start-up
    assert reopened.size_bytes == 100


@settings(max_examples=30, deadline=None)
@given(
    size=st.integers(1, 3 * HASH_CHUNK_BYTES + 17),
    flip=st.integers(0, 3 * HASH_CHUNK_BYTES + 16),
    first=st.integers(0, 3 * HASH_CHUNK_BYTES + 16),
    length=st.integers(1, 2 * HASH_CHUNK_BYTES),
)
def test_block_digests_catch_a_flipped_byte_in_exactly_the_ranges_that_touch_its_block(
    size: int, flip: int, first: int, length: int
) -> None:
    """Block digests recorded while the whole file verified; then a byte flips on disk: a range
    touching the flipped byte's block is refused, any other range is checked intact (its bytes
    are the stored ones: the flip is elsewhere)."""
    flip, first = flip % size, first % size
    last = min(size - 1, first + length - 1)
    data = os.urandom(size)
    blocks: list[bytes] = []
    with tempfile.NamedTemporaryFile() as f:
        f.write(data)
        f.flush()
        assert digest_fd(os.dup(f.fileno()), size, 0, blocks=blocks).sha256 == (
            hashlib.sha256(data).hexdigest()
        )
        kept = BlockDigests()
        kept.put(hashlib.sha256(data).hexdigest(), size, blocks)
        known = kept.get(hashlib.sha256(data).hexdigest(), size)
        assert known is not None
        assert len(known) == -(-size // HASH_CHUNK_BYTES)
        assert problem_with_blocks(os.dup(f.fileno()), first, last, known) is None
        os.pwrite(f.fileno(), bytes([data[flip] ^ 0x01]), flip)
        found = problem_with_blocks(os.dup(f.fileno()), first, last, known)
    touched = first // HASH_CHUNK_BYTES <= flip // HASH_CHUNK_BYTES <= last // HASH_CHUNK_BYTES
    assert (found is not None) == touched, found


def test_block_digests_keep_the_most_recent_within_their_byte_bound() -> None:
    kept = BlockDigests(max_bytes=16 * 5)
    kept.put("a", 2 * HASH_CHUNK_BYTES, [b"a" * 16] * 2)
    kept.put("b", 2 * HASH_CHUNK_BYTES, [b"b" * 16] * 2)
    assert kept.get("a", 2 * HASH_CHUNK_BYTES) is not None  # now the most recent
    kept.put("c", 2 * HASH_CHUNK_BYTES, [b"c" * 16] * 2)
    assert kept.get("b", 2 * HASH_CHUNK_BYTES) is None
    assert kept.get("a", 2 * HASH_CHUNK_BYTES) is not None
    assert kept.get("a", 2 * HASH_CHUNK_BYTES + 1) is None  # another size is other content
    kept.put("d", 3 * HASH_CHUNK_BYTES, [b"d" * 16] * 2)  # too few blocks for its size
    assert kept.get("d", 3 * HASH_CHUNK_BYTES) is None


def test_concurrent_digests_of_one_file_share_one_run_and_the_last_to_leave_stops_it(
    tmp_path: Path,
) -> None:
    """``ReadVerifier.digest``: two shares of the same open file get one run's digest and tail;
    a run all of whose waiters left (their clients went away) stops before its next read, and
    the next request starts afresh (issue 26: aborted GETs hashed whole blobs for nobody)."""
    data = os.urandom(3 * HASH_CHUNK_BYTES + 5)
    path = tmp_path / "blob"
    path.write_bytes(data)

    async def scenario() -> None:
        verifier = ReadVerifier(threads=1)
        try:
            with path.open("rb") as f, path.open("rb") as g:
                gate = threading.Event()  # holds the pool's one thread: the runs queue
                verifier.pool.submit(gate.wait)
                a = verifier.digest(f.fileno(), len(data), 7, (SHA256,))
                b = verifier.digest(g.fileno(), len(data), 7, (SHA256,))
                gate.set()
                da, db = await a.result(), await b.result()
                assert da is db
                assert da.sha256 == hashlib.sha256(data).hexdigest()
                assert da.tail == data[-7:]
                a.leave()
                b.leave()
                gate.clear()
                verifier.pool.submit(gate.wait)
                gone = verifier.digest(f.fileno(), len(data), 7, (SHA256,))
                gone.leave()  # the client went away before the run started
                again = verifier.digest(f.fileno(), len(data), 7, (SHA256,))
                gate.set()
                with pytest.raises(DigestStopped):
                    await gone._job.result
                assert (await again.result()).sha256 == da.sha256
                again.leave()
        finally:
            verifier.close()

    asyncio.run(scenario())
