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
before anything is quarantined.
All functions here block; call them from an executor.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from kura.core.manifest import Manifest
from kura.storage.checksum import SHA256, new_hasher

HASH_CHUNK_BYTES = 1024 * 1024


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
    fd: int, size_bytes: int, tail_bytes: int, algorithms: Sequence[str] = (SHA256,)
) -> FileDigest:
    """Hash the first ``size_bytes`` bytes of ``fd`` with each of ``algorithms``
    (``storage.checksum.ALGORITHMS``) using ``pread`` (no shared file offset, so another
    reader of the same open file is undisturbed) and keep the last ``tail_bytes``. Stops early
    at end of file (``size_bytes`` of the result is then smaller). Closes ``fd``."""
    try:
        hashers = {a: new_hasher(a) for a in algorithms}
        tail_from = size_bytes - tail_bytes
        tail: list[bytes] = []
        offset = 0
        while offset < size_bytes:
            chunk = os.pread(fd, min(HASH_CHUNK_BYTES, size_bytes - offset), offset)
            if not chunk:
                break
            for h in hashers.values():
                h.update(chunk)
            end = offset + len(chunk)
            if end > tail_from:
                tail.append(chunk[max(0, tail_from - offset) :])
            offset = end
        digests = {a: h.hexdigest() for a, h in hashers.items()}
        return FileDigest(digests, offset, b"".join(tail))
    finally:
        os.close(fd)


class ReadVerifier:
    """A small thread pool that hashes blobs being sent. Safe to use from any task."""

    def __init__(self, threads: int = 4) -> None:
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="kura-verify")

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
