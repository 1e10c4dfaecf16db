"""Small request bodies read into memory, to be stored inline in the index instead of a file.

A body whose declared length is at most ``KURA_INLINE_MAX_BYTES`` (or, without a declared
length, that ends within it) is read whole into memory by ``buffer_small``: it is never staged
in the tmp dir, so it takes no tmp-budget reservation and costs no file fsync and no directory
fsync; the row (with the body) is made durable by the index's one WAL commit. A body without a
declared length that grows past the threshold *spills*: ``buffer_small`` hands back an iterator
that yields the bytes read so far and then the rest, for the normal staged-file path, which
counts and checks every byte from the start.

Memory is bounded without the tmp budget: each request holds at most the threshold (which
``kura.settings`` caps at 1 MiB), about what aiohttp's own read buffer
already holds per connection (its ``StreamReader`` high-water mark is 128 KiB), and the number
of requests in flight is bounded by the server's connections.

The checks are those ``storage.blobs.stage_body`` makes, by the same code
(``storage.body_count``): the route's limit (``PayloadTooLarge``), a body longer than its
declared length (``InvalidRequest``) or shorter (``IncompleteBody``), and an expected SHA-256
(``DigestMismatch``, e.g. Bazel's ``cas/`` path digest).

Every path that reads or moves a body takes an inline row as it takes a file: reads (ranges and
conditional requests included), the scrub, quarantine, eviction and expiry (inline bytes count
against ``KURA_MAX_DISK_BYTES``), replication and bootstrap (a peer stores an inline copy inline),
anti-entropy, the object-storage tier and the gRPC CAS. The threshold stays small because a row
larger than a SQLite page (4 KiB) spills into overflow pages, which every manifest scan reading a
column stored after the body walks (docs/benchmarks.md, "Inline small blobs").
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator

from kura.storage.body_count import BodyCount, check_sha256


def fits_inline(threshold_bytes: int, declared_length: int | None) -> bool:
    """Whether a body of ``declared_length`` (None: unknown, chunked) is first read into memory
    under ``threshold_bytes`` (0 = inline storage off)."""
    if threshold_bytes <= 0:
        return False
    return declared_length is None or declared_length <= threshold_bytes


async def buffer_small(
    body: AsyncIterator[bytes],
    threshold_bytes: int,
    *,
    limit_bytes: int,
    declared_length: int | None,
) -> bytes | AsyncIterator[bytes]:
    """The whole of ``body`` when it ends within ``threshold_bytes``, else (only possible
    without ``declared_length``) an iterator over all of it, from the first byte, to stage.

    Raises ``PayloadTooLarge`` past ``limit_bytes``, ``InvalidRequest`` for more bytes than
    ``declared_length`` and ``IncompleteBody`` for fewer.
    """
    chunks: list[bytes] = []
    count = BodyCount(limit_bytes=limit_bytes, declared_length=declared_length)
    async for chunk in body:
        chunks.append(chunk)
        if count.add(chunk) > threshold_bytes:
            return _spill(chunks, body)
    count.finish()
    return b"".join(chunks)


def check_digest(data: bytes, expected_sha256: str | None) -> str:
    """The SHA-256 (hex) of ``data``; ``DigestMismatch`` when ``expected_sha256`` is given and
    differs (the message ``stage_body`` gives)."""
    digest = hashlib.sha256(data).hexdigest()
    check_sha256(digest, expected_sha256)
    return digest


async def _spill(head: list[bytes], rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    for chunk in head:
        yield chunk
    async for chunk in rest:
        yield chunk
