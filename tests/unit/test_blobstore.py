"""The local disk (``BlobFiles``) implements the ``BlobStore`` seam a second tier implements."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from kura.core.manifest import Manifest
from kura.storage.blobs import BlobFiles, stat_signature
from kura.storage.blobstore import BlobStore
from kura.storage.fsync import fsync_path


def _manifest(data: bytes, version_ms: int) -> Manifest:
    return Manifest(
        artifact_id="ab" * 32,
        producer="nx",
        namespace_id="",
        key="k",
        content_type="application/octet-stream",
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        version_ms=version_ms,
        created_at_ms=version_ms,
        inline=False,
        headers={},
    )


def _staged(files: BlobFiles, data: bytes) -> Path:
    path = files.new_staging_path("uploads")
    path.write_bytes(data)
    fsync_path(path)
    return path


def test_disk_blob_files_put_open_remove_and_list_versions(tmp_path: Path) -> None:
    files = BlobFiles(tmp_path / "data", tmp_path / "tmp")
    files.open()
    try:
        store: BlobStore = files
        assert isinstance(files, BlobStore)
        old, new = _manifest(b"old bytes", 1), _manifest(b"new bytes", 2)
        sig = store.put(_staged(files, b"old bytes"), old)
        assert sig == stat_signature(os.stat(files.blob_path(old)))
        store.put(_staged(files, b"new bytes"), new)
        with store.open_blob(old) as f:  # a put never replaces another version's blob
            assert f.read() == b"old bytes"
        assert list(store.artifact_ids()) == [old.artifact_id]
        store.remove(old)
        store.remove(old)  # idempotent
        with pytest.raises(FileNotFoundError):
            store.open_blob(old)
        with store.open_blob(new) as f:
            assert f.read() == b"new bytes"
        store.remove_artifact(new.artifact_id)
        with pytest.raises(FileNotFoundError):
            store.open_blob(new)
        assert list(store.artifact_ids()) == []
    finally:
        files.close()
