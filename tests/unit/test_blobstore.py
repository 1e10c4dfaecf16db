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


class RecordingGroup:
    """A ``PublishGroup`` that records what ``persist`` asks it to make durable."""

    def __init__(self) -> None:
        self.dirs: list[Path] = []
        self.paths: list[Path] = []

    def published(self, path: Path) -> None:
        self.paths.append(path)

    def sync_dir_later(self, directory: Path) -> None:
        self.dirs.append(directory)


def test_a_new_bucket_directory_is_made_durable_in_its_parent_too(tmp_path: Path) -> None:
    files = BlobFiles(tmp_path / "data", tmp_path / "tmp")
    files.open()
    group = RecordingGroup()
    files.group = group
    try:
        first = _manifest(b"first", 1)
        files.put(_staged(files, b"first"), first)
        bucket = files.blob_path(first).parent  # blobs/ab/ab: both created by this put
        assert group.dirs == [bucket, bucket.parent, files.blobs_dir]
        assert group.paths == [files.blob_path(first)]
        group.dirs.clear()
        files.put(_staged(files, b"second"), _manifest(b"second", 2))
        assert group.dirs == [bucket]  # the bucket exists now: only its own entry changed
    finally:
        files.close()
