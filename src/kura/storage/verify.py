"""Checks of stored bytes against their manifest: what is wrong with a blob, if anything.

Every check names the problem it found as a short English phrase (logged and kept beside the
quarantined file), or returns None when the bytes are intact. One set of checks serves the read
path, the scrub and the "exists and intact" test of PUT routes that skip existing keys, so
"intact" means the same everywhere: the size equals ``manifest.size`` and the SHA-256 of the
bytes equals ``manifest.sha256``.

``ReadVerifier`` hashes a blob *while* it is being sent (``digest_fd`` on a duplicate of the
open file's descriptor, in its own bounded thread pool; hashlib releases the GIL on large
updates), so a large GET pays for the hash in parallel with ``sendfile`` instead of before it.
The sender checks the row's XXH3-128 when it has one (``storage.checksum``: many times faster
than SHA-256), else SHA-256; either way a mismatch is confirmed with SHA-256 by the writer
before anything is quarantined. ``ReadVerifier.digest`` runs those hashes: one run for all the
concurrent requests of the same file, stopped once none of them waits for it any more.

``BlockDigests`` keeps, for blobs whose whole file was just verified, the XXH3-128 of each
``HASH_CHUNK_BYTES`` block (``digest_fd(..., blocks=)`` records them in the same pass), so a
later byte range of the same content is checked by hashing only the blocks it touches
(``problem_with_blocks``): a 1-byte range of a 512 MiB blob hashed the whole file every time
(issue 26). The digests describe the *content* (they are kept only after the whole file matched
the row's digest), so they stay right for any file that claims that content; a damaged block is
caught as surely as by a whole-file hash, and only the intact bytes of a damaged file can be
served (never a wrong byte).
All functions here block; call them from an executor.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import xxhash

from kura.core.manifest import Manifest
from kura.storage.checksum import SHA256, new_hasher

HASH_CHUNK_BYTES = 1024 * 1024
BLOCK_DIGESTS_MAX_BYTES = 8 * 1024 * 1024  # 16 bytes a MiB: the blocks of 512 GiB of blobs


def problem_with_bytes(data: bytes | None, manifest: Manifest) -> str | None:
    """What is wrong with in-memory ``data`` as the body of ``manifest`` (None = intact)."""
    if data is None:
        return "the index row holds no body"
    if len(data) != manifest.size:
        return f"the body holds {len(data)} bytes"
    digest = hashlib.sha256(data).hexdigest()
    if digest != manifest.sha256:
        return f"the body hashes to sha256 {digest}"
    return None


def problem_with_file(
    path: Path, manifest: Manifest, pace: Callable[[int], None] | None = None
) -> str | None:
    """What is wrong with the file at ``path`` as the body of ``manifest`` (None = intact).

    ``pace(n)`` is called after every chunk of ``n`` bytes read (the scrub's rate limit; it may
    sleep or raise to stop the check). Raises only what ``pace`` raises; a missing or unreadable
    file is a problem, not an error.
    """
    try:
        f = path.open("rb")
    except FileNotFoundError:
        return "the blob file is missing"
    try:
        with f:
            size = os.fstat(f.fileno()).st_size
            if size != manifest.size:
                return f"the file holds {size} bytes"
            h = hashlib.sha256()
            while chunk := f.read(HASH_CHUNK_BYTES):
                h.update(chunk)
                if pace is not None:
                    pace(len(chunk))
    except OSError as exc:  # EIO from a failing disk: unreadable bytes are damaged bytes
        return f"reading the file failed: {exc}"
    digest = h.hexdigest()
    if digest != manifest.sha256:
        return f"the file hashes to sha256 {digest}"
    return None


class DigestStopped(Exception):
    """``digest_fd`` was told to stop: nobody waits for its result any more."""


@dataclass(frozen=True)
class FileDigest:
    """What ``digest_fd`` read: {algorithm: hex digest} of ``size_bytes`` bytes from offset
    0, every algorithm over the same bytes, and the last ``len(tail)`` of those bytes, exactly
    as hashed."""

    digests: dict[str, str]
    size_bytes: int
    tail: bytes

    @property
    def sha256(self) -> str:
        """The SHA-256 (``KeyError`` if it was not asked for)."""
        return self.digests[SHA256]


def digest_fd(
    fd: int,
    size_bytes: int,
    tail_bytes: int,
    algorithms: Sequence[str] = (SHA256,),
    blocks: list[bytes] | None = None,
    stop: threading.Event | None = None,
) -> FileDigest:
    """Hash the first ``size_bytes`` bytes of ``fd`` with each of ``algorithms``
    (``storage.checksum.ALGORITHMS``) using ``pread`` (no shared file offset, so another
    reader of the same open file is undisturbed) and keep the last ``tail_bytes``. Stops early
    at end of file (``size_bytes`` of the result is then smaller). With ``blocks``, appends the
    XXH3-128 digest (16 bytes) of each ``HASH_CHUNK_BYTES`` block to it (left empty if a read
    came back short before the end). Raises ``DigestStopped`` once ``stop`` is set (checked
    before each read). Closes ``fd``."""
    try:
        hashers = {a: new_hasher(a) for a in algorithms}
        tail_from = size_bytes - tail_bytes
        tail: list[bytes] = []
        offset = 0
        while offset < size_bytes:
            if stop is not None and stop.is_set():
                raise DigestStopped(f"stopped after {offset} of {size_bytes} bytes")
            want = min(HASH_CHUNK_BYTES, size_bytes - offset)
            chunk = os.pread(fd, want, offset)
            if not chunk:
                break
            for h in hashers.values():
                h.update(chunk)
            if blocks is not None:
                if len(chunk) == want:
                    blocks.append(xxhash.xxh3_128_digest(chunk))
                else:  # the blocks would no longer line up
                    blocks.clear()
                    blocks = None
            end = offset + len(chunk)
            if end > tail_from:
                tail.append(chunk[max(0, tail_from - offset) :])
            offset = end
        digests = {a: h.hexdigest() for a, h in hashers.items()}
        return FileDigest(digests, offset, b"".join(tail))
    finally:
        os.close(fd)


def problem_with_blocks(
    fd: int, first_byte: int, last_byte: int, blocks: Sequence[bytes]
) -> str | None:
    """What is wrong with the bytes ``first_byte``..``last_byte`` (inclusive) of ``fd``,
    checked whole ``HASH_CHUNK_BYTES`` blocks at a time against ``blocks`` (``digest_fd``'s, of
    the intact content; None = intact). A short read hashes to something else; a failed one is
    a problem too. Closes ``fd``."""
    try:
        for n in range(first_byte // HASH_CHUNK_BYTES, last_byte // HASH_CHUNK_BYTES + 1):
            if n >= len(blocks):
                return f"the range ends past the {len(blocks)} known blocks"
            offset = n * HASH_CHUNK_BYTES
            try:
                chunk = os.pread(fd, HASH_CHUNK_BYTES, offset)
            except OSError as exc:
                return f"reading the file failed: {exc}"
            if xxhash.xxh3_128_digest(chunk) != blocks[n]:
                return f"block {n} (bytes from {offset}) hashes to something else"
        return None
    finally:
        os.close(fd)


class BlockDigests:
    """The block digests (``digest_fd(..., blocks=)``) of recently verified blobs, by content
    (SHA-256 and size), least recently used dropped first, at most ``max_bytes`` of digests.
    Not thread-safe: use it from the event loop."""

    def __init__(self, max_bytes: int = BLOCK_DIGESTS_MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._held_bytes = 0
        self._by_content: OrderedDict[tuple[str, int], tuple[bytes, ...]] = OrderedDict()

    def get(self, sha256: str, size_bytes: int) -> tuple[bytes, ...] | None:
        """The blocks of the content ``sha256`` of ``size_bytes`` bytes, or None."""
        found = self._by_content.get((sha256, size_bytes))
        if found is not None:
            self._by_content.move_to_end((sha256, size_bytes))
        return found

    def put(self, sha256: str, size_bytes: int, blocks: Sequence[bytes]) -> None:
        """Keep ``blocks``, the digests of every block of that content, verified whole."""
        expected = -(-size_bytes // HASH_CHUNK_BYTES)
        held = 16 * len(blocks)
        if len(blocks) != expected or held > self.max_bytes:
            return
        self.forget(sha256, size_bytes)
        self._by_content[(sha256, size_bytes)] = tuple(blocks)
        self._held_bytes += held
        while self._held_bytes > self.max_bytes:
            _key, dropped = self._by_content.popitem(last=False)
            self._held_bytes -= 16 * len(dropped)

    def forget(self, sha256: str, size_bytes: int) -> None:
        dropped = self._by_content.pop((sha256, size_bytes), None)
        if dropped is not None:
            self._held_bytes -= 16 * len(dropped)


_JobKey = tuple[int, int, int, int, int, tuple[str, ...], bool]


class _Job:
    """One ``digest_fd`` run in the pool and the responses waiting for it."""

    result: asyncio.Future[FileDigest]

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.blocks: list[bytes] = []
        self.waiters = 0


class DigestShare:
    """One response's share of a hash (``ReadVerifier.digest``): await ``result``, and call
    ``leave`` when done with it, whether the result came or not (the client went away)."""

    def __init__(self, verifier: ReadVerifier, key: _JobKey, job: _Job) -> None:
        self._verifier, self._key, self._job = verifier, key, job
        self._left = False
        job.waiters += 1

    async def result(self) -> FileDigest:
        """The digest; raises what ``digest_fd`` raised (``OSError``). Cancelling this await
        leaves the job running for the other waiters."""
        return await asyncio.shield(self._job.result)

    @property
    def blocks(self) -> list[bytes]:
        """The block digests (asked with ``blocks=True``), complete once ``result`` is."""
        return self._job.blocks

    def done(self) -> bool:
        return self._job.result.done()

    def leave(self) -> None:
        """Stop waiting (idempotent). The last waiter to leave a job that has not finished
        stops it before its next read, and a later request starts afresh."""
        if self._left:
            return
        self._left = True
        job = self._job
        job.waiters -= 1
        if job.waiters == 0 and not job.result.done():
            job.stop.set()
            if self._verifier._jobs.get(self._key) is job:
                del self._verifier._jobs[self._key]


class ReadVerifier:
    """A small thread pool that hashes blobs being sent. ``digest`` runs the hashes that
    responses wait for; use it from the event loop."""

    def __init__(self, threads: int = 4) -> None:
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="kura-verify")
        self.blocks = BlockDigests()
        self._jobs: dict[_JobKey, _Job] = {}

    def digest(
        self,
        fd: int,
        size_bytes: int,
        tail_bytes: int,
        algorithms: Sequence[str],
        blocks: bool = False,
    ) -> DigestShare:
        """A share of ``digest_fd`` over the open file ``fd`` (not closed; a duplicate is
        hashed), run in the pool. Work is bounded by what the waiting responses cost (issue
        26: 40 GETs of a 256 MiB blob that hung up after 4 KiB read 9.9 GiB):

        * concurrent requests for the same file (device, inode and ctime, so an overwrite
          or a change starts a new hash) and the same parameters join one run, and all get
          the same digest and tail bytes, exactly as hashed;
        * when every waiter has left before the result (its client went away), the run stops
          before its next ``HASH_CHUNK_BYTES`` read: nothing is left to be served from it.

        A damaged file is still found by any hash that completes, and its waiters report it.
        """
        st = os.fstat(fd)
        key: _JobKey = (
            st.st_dev,
            st.st_ino,
            st.st_ctime_ns,
            size_bytes,
            tail_bytes,
            tuple(algorithms),
            blocks,
        )
        job = self._jobs.get(key)
        if job is None:
            job = _Job()
            cfut = self.pool.submit(
                digest_fd,
                os.dup(fd),
                size_bytes,
                tail_bytes,
                algorithms,
                job.blocks if blocks else None,
                job.stop,
            )
            job.result = asyncio.wrap_future(cfut)
            job.result.add_done_callback(functools.partial(self._finished, key, job))
            self._jobs[key] = job
        return DigestShare(self, key, job)

    def _finished(self, key: _JobKey, job: _Job, _done: asyncio.Future[FileDigest]) -> None:
        if self._jobs.get(key) is job:
            del self._jobs[key]
        if not job.result.cancelled():
            job.result.exception()  # retrieved: the waiters, if any, saw it

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
