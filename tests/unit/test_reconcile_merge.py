"""Start-up reconciliation as a merge of rows and files in artifact_id order
(``storage.reconcile``, ``BlobFiles.stored_files``), on a real data dir: rows with their file,
superseded versions, files without a row, rows without a file, a misplaced file, and inline rows,
interleaved so that a merge that lost its place would drop a row whose file is there."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from kura.core.manifest import Manifest
from kura.storage import blobs
from kura.storage.blobs import BlobFiles, stat_signature
from kura.storage.reconcile import reconcile
from kura.storage.recovery import note_reconciled, open_index


def _manifest(artifact_id: str, data: bytes, version_ms: int, inline: bool = False) -> Manifest:
    return Manifest(
        artifact_id=artifact_id,
        producer="nx",
        namespace_id="nx",
        key=artifact_id[:8],
        content_type="application/octet-stream",
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        version_ms=version_ms,
        created_at_ms=version_ms,
        inline=inline,
        headers={},
    )


def _write(files: BlobFiles, m: Manifest, data: bytes) -> Path:
    path = files.blob_path(m)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("ahead", [1, 2, 64])
def test_reconcile_keeps_every_current_file_and_removes_or_drops_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ahead: int
) -> None:
    # Bucket listings are read ahead (blobs.LIST_AHEAD): the merge must see them in order
    # whether the window is one bucket, a few, or more than the data dir has.
    monkeypatch.setattr(blobs, "LIST_AHEAD", ahead)
    files = BlobFiles(tmp_path / "data", tmp_path / "tmp")
    index, _report = open_index(files)
    ids = [f"{i:02x}" * 32 for i in (0x10, 0x11, 0x20, 0x21, 0x30, 0xA0, 0xA1, 0xFF)]
    kept: dict[str, Path] = {}
    # Rows with their current file, each with a superseded version beside it for some.
    for n, aid in enumerate(ids[:4] + ids[5:7]):
        current = _manifest(aid, f"current {n}".encode(), 100 + n)
        kept[aid] = _write(files, current, f"current {n}".encode())
        index.upsert(current, None, stat_signature(kept[aid].stat()), 100 + n)
        if n % 2 == 0:
            _write(files, _manifest(aid, b"older", 50 + n), b"older")
    # A row whose file is gone: dropped.
    gone = _manifest(ids[4], b"gone", 7)
    index.upsert(gone, None, None, 7)
    # An inline row, with a stray file of the same id: the file goes, the row stays.
    inline = _manifest(ids[7], b"inline", 8, inline=True)
    index.upsert(inline, b"inline", None, 8)
    _write(files, _manifest(ids[7], b"stray", 9), b"stray")
    # Files with no row at all, before, between and after the rows' ids.
    orphans = [
        _write(files, _manifest(aid, b"orphan", 1), b"orphan")
        for aid in ("00" * 32, "15" * 32, "a0" + "00" * 31, "fe" * 32)
    ]
    # A misplaced file: the id of a later row (a1…), in the bucket of an earlier one (10/10).
    # In the stream it comes before 10…'s files; it must neither hide them nor be kept.
    later = index.get(ids[6])
    assert later is not None
    misplaced = files.bucket(ids[0]) / files.blob_path(later[0]).name
    misplaced.write_bytes(b"misplaced")

    report = reconcile(files, index)

    assert report.dropped_rows == 1
    assert index.get(gone.artifact_id) is None
    assert index.get(inline.artifact_id) is not None
    for aid, path in kept.items():
        assert path.is_file(), aid
        assert index.get(aid) is not None, aid
    assert not any(p.exists() for p in orphans)
    assert not misplaced.exists()
    left = sorted(p for _aid, versions in files.stored_files() for p in versions)
    assert left == sorted(kept.values())
    # 3 superseded versions, 1 stray beside the inline row, 4 orphans, 1 misplaced.
    assert report.removed_files == 3 + 1 + 4 + 1
    assert [aid for aid, _v in files.stored_files()] == sorted(kept)
    index.close_thread_connection()
    files.close()


def test_start_up_removes_incoming_leftovers_in_the_one_walk_and_never_lists_them(
    tmp_path: Path,
) -> None:
    """``*.incoming-*`` files a publish left under ``blobs/`` (``BlobFiles.persist`` across
    filesystems, ``put_concatenated``) are removed at start-up by reconcile's own walk
    (``sweep_staging`` no longer globs the blob tree). One named after the id of a row, in that
    row's bucket, must not be taken for a version of it, one named after an id without a row
    must not be listed as an artifact, and ones not named after an id (in a bucket, at the top
    of ``blobs/``) must go too. The acknowledged file is untouched and is what the row names."""
    files = BlobFiles(tmp_path / "data", tmp_path / "tmp")
    index, _report = open_index(files)
    aid, stray_id = "ab" * 32, "ab" * 2 + "cd" * 30
    current = _manifest(aid, b"acknowledged", 100)
    kept = _write(files, current, b"acknowledged")
    index.upsert(current, None, stat_signature(kept.stat()), 100)
    index.close_thread_connection()
    files.close()
    bucket = files.bucket(aid)
    leftovers = [
        bucket / f"{aid}.incoming-{'1' * 32}",  # the row's id: sorts among its versions
        bucket / f"{stray_id}.incoming-{'2' * 32}",  # an id that has no row
        bucket / f"x.incoming-{'3' * 32}",  # not named after an id
        files.blobs_dir / f"multipart.incoming-{'4' * 16}",  # put_concatenated's, at the top
    ]
    for path in leftovers:
        path.write_bytes(b"partial")
    (tmp_path / "tmp" / "uploads" / "upload-left").write_bytes(b"staged")
    # Listed without removal (as at run time), a leftover is never an artifact or a version.
    assert list(files.stored_files()) == [(aid, [kept])]
    assert all(path.exists() for path in leftovers)

    files = BlobFiles(tmp_path / "data", tmp_path / "tmp")
    index, report = open_index(files)  # then the walk, as the start-up work runs it
    note_reconciled(report, reconcile(files, index))

    assert [path for path in leftovers if path.exists()] == []
    assert report.swept_files == 1 + len(leftovers)
    assert report.reconciled.swept_incoming == len(leftovers)
    assert report.reconciled.removed_files == 0  # no leftover was taken for a version
    assert report.reconciled.dropped_rows == 0
    assert list(files.stored_files()) == [(aid, [kept])]
    assert list(files.artifact_ids()) == [aid]
    got = index.get(aid)
    assert got is not None
    assert files.blob_path(got[0]) == kept
    with files.open_blob(got[0]) as body:
        assert body.read() == b"acknowledged"
    assert index.get(stray_id) is None
    assert sorted(p.name for p in (tmp_path / "tmp" / "uploads").iterdir()) == []
    index.close_thread_connection()
    files.close()
