"""``open_reads``: the one place a read path (``storage.reads.ArtifactReads``) is built, with
the pieces it shares with the store around it: the blob files, the hot cache, the verifier of
large bodies sent, the reader pool and the access times. The primary's store
(``storage.service.CacheService``) and a worker's reader (``storage.worker_reads.WorkerReads``)
each open theirs here and take those pieces from it (``reads.files``, ``reads.hot``, ...);
what differs between them is given: the index, the thread that gives verdicts on damage
(``damaged``), where checksums go, who hears of a body sent again and whether ``exists`` is a read for the LRU.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from pathlib import Path

from kit.clock import Clock
from kura.core.manifest import Manifest
from kura.storage.blobs import BlobFiles
from kura.storage.hotcache import HotCache
from kura.storage.index import MetadataIndex
from kura.storage.reads import ArtifactReads, always_open
from kura.storage.state import SMALL_BLOB_BYTES, AccessTimes
from kura.storage.verify import ReadVerifier


def open_reads(
    *,
    data_dir: Path,
    tmp_dir: Path,
    tenant_id: str,
    clock: Clock,
    verify_reads: str,
    hot_cache_bytes: int,
    index: Callable[[], MetadataIndex],
    reader: Executor,
    writer: Executor,
    damaged: Callable[[Manifest, str], bool],
    record_checksums: Callable[[list[tuple[Manifest, str]]], None],
    sent_again: Callable[[str], None] = lambda artifact_id: None,
    note_exists: bool = False,
    promises: bool = False,
    reads_open: Callable[[], Awaitable[None]] = always_open,
) -> ArtifactReads:
    """A read path over new blob files (``data_dir``, ``tmp_dir``), hot cache
    (``hot_cache_bytes``), verifier and access times; the other arguments are
    ``ArtifactReads``' own; ``promises``: whether the access times keep promises
    (``KURA_MIN_RETENTION`` set, ``storage.retention``)."""
    return ArtifactReads(
        index=index,
        files=BlobFiles(data_dir, tmp_dir),
        hot=HotCache(hot_cache_bytes, SMALL_BLOB_BYTES),
        verifier=ReadVerifier(),
        verify_reads=verify_reads,
        tenant_id=tenant_id,
        clock=clock,
        reader=reader,
        writer=writer,
        damaged=damaged,
        accesses=AccessTimes(promises=promises),
        record_checksums=record_checksums,
        sent_again=sent_again,
        note_exists=note_exists,
        reads_open=reads_open,
    )
