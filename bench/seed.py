"""Seed a stopped node's data dir with many small artifacts, offline, through kura's storage layer.

Writing a million artifacts through HTTP, each with its own fsyncs, takes far longer than what a
mesh benchmark measures (bootstrap, catch-up, anti-entropy). This seeder makes the same calls the
write path makes (``BlobFiles.blob_path`` for the file, ``MetadataIndex.upsert`` for the row, with
its XXH3-128 and stat signature) but with ``PRAGMA synchronous=OFF`` and no per-file fsync, then
syncs the file system once at the end. The node that later opens the data dir runs its normal
start-up (migration, reconcile) on it.

Artifact ``i`` is Nx hash ``k{i}`` (``GET /v1/cache/k{i}``, producer and namespace ``nx``) with a
body from ``body_of(i, size)``: unique per artifact and reproducible, so a reader can check it.
Its ``version_ms`` is ``base_ms + i``: a later index is newer. With ``inline=True`` each body is
stored inside its index row (what a PUT of at most ``KURA_INLINE_MAX_BYTES`` does) and no blob
file is written.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from kura.core.keys import artifact_id
from kura.core.manifest import Manifest
from kura.storage.blobs import BlobFiles, stat_signature
from kura.storage.checksum import xxh3_128_hex
from kura.storage.recovery import open_index

TENANT = "default"
PAD = hashlib.sha256(b"kura mesh-scale body").digest() * 64


def key_of(i: int) -> str:
    return f"k{i}"


def body_of(i: int, size: int) -> bytes:
    """``size`` bytes (at least 8) unique to ``i``."""
    head = i.to_bytes(8, "big")
    return head + PAD[: size - 8] if size <= len(PAD) + 8 else head + os.urandom(size - 8)


def aid_of(i: int) -> str:
    return artifact_id("nx", TENANT, "nx", key_of(i))


def seed(
    data_dir: Path, tmp_dir: Path, count: int, size: int, base_ms: int, *, inline: bool = False
) -> int:
    """Write artifacts ``0 .. count-1`` into ``data_dir`` (as files, or inline in their rows);
    return the bytes written."""
    files = BlobFiles(data_dir, tmp_dir)
    index, _report = open_index(files)
    conn = index.connection()
    conn.execute("PRAGMA synchronous=OFF")
    made: set[Path] = set()
    total = 0
    try:
        for i in range(count):
            body = body_of(i, size)
            manifest = Manifest(
                artifact_id=aid_of(i),
                producer="nx",
                namespace_id="nx",
                key=key_of(i),
                content_type="application/octet-stream",
                size=len(body),
                sha256=hashlib.sha256(body).hexdigest(),
                version_ms=base_ms + i,
                created_at_ms=base_ms + i,
            )
            if inline:
                index.upsert(manifest, body, None, base_ms + i, xxh3_128=xxh3_128_hex(body))
                total += len(body)
                continue
            path = files.blob_path(manifest)
            if path.parent not in made:
                path.parent.mkdir(parents=True, exist_ok=True)
                made.add(path.parent)
            with path.open("wb") as f:
                f.write(body)
            index.upsert(
                manifest,
                None,
                stat_signature(path.stat()),
                base_ms + i,
                xxh3_128=xxh3_128_hex(body),
            )
            total += len(body)
    finally:
        index.close_thread_connection()
        files.close()
    os.sync()
    return total
