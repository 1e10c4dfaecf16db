"""The two digests of a stored body, computed over the same bytes in one pass.

SHA-256 is an artifact's identity: CAS paths, manifests, replication and the scrub use it. A
second, non-cryptographic checksum, XXH3-128 (https://github.com/Cyan4973/xxHash, "XXH3"; tens
of GB/s against SHA-256's ~0.5 GB/s on one core here), is recorded beside it in the index when a
body is staged or assembled, and is what a large GET checks while sending
(``kura.api.file_response``). It guards against accidental damage (a flipped bit below the
filesystem, a torn write), not against an adversary who can write the data dir; an adversary
who can do that can rewrite the index too. A mismatch on either digest is confirmed with
SHA-256 before an entry is quarantined (``ArtifactReader.report_corrupt``).

Digests are lowercase hex: 64 digits for SHA-256, 32 for XXH3-128 (xxhash's ``hexdigest``,
the canonical big-endian form of the 128-bit value).
"""

from __future__ import annotations

import hashlib
from typing import Protocol

import xxhash

SHA256 = "sha256"
XXH3_128 = "xxh3_128"
ALGORITHMS = (SHA256, XXH3_128)


class Hasher(Protocol):
    def update(self, data: bytes, /) -> None: ...

    def hexdigest(self) -> str: ...


def new_hasher(algorithm: str) -> Hasher:
    """A fresh hasher for ``algorithm`` (one of ``ALGORITHMS``; ``ValueError`` otherwise)."""
    if algorithm == SHA256:
        return hashlib.sha256()
    if algorithm == XXH3_128:
        return xxhash.xxh3_128()
    raise ValueError(f"unknown digest algorithm {algorithm!r}")


def xxh3_128_hex(data: bytes) -> str:
    """XXH3-128 of ``data``, 32 lowercase hex digits."""
    return xxhash.xxh3_128_hexdigest(data)


class BodyDigests:
    """SHA-256 and XXH3-128 of everything passed to ``update``, in order: both digests are
    always of exactly the same bytes."""

    def __init__(self) -> None:
        self._sha256 = hashlib.sha256()
        self._xxh3 = xxhash.xxh3_128()

    def update(self, chunk: bytes) -> None:
        self._sha256.update(chunk)
        self._xxh3.update(chunk)

    @property
    def sha256(self) -> str:
        return self._sha256.hexdigest()

    @property
    def xxh3_128(self) -> str:
        return self._xxh3.hexdigest()
