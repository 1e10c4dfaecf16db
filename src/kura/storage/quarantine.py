"""The quarantine: where stored bytes go when they no longer match their manifest.

A corrupt entry is evidence (a failing disk, a bad controller, an operator's mistake), so it is
moved aside instead of deleted: ``DATA_DIR/quarantine/<ms>-<artifact_id>-<rand>`` holds the bytes
as found and ``<same name>.json`` what they should have been (the manifest) and what was found.
The directory is bounded by ``max_bytes`` (``KURA_QUARANTINE_MAX_BYTES``): admitting a file
deletes the oldest ones first until the total fits, so a disk that keeps corrupting cannot fill
up with evidence. A file larger than the whole bound is deleted at once (the WARNING log line
written when it was quarantined remains its record).

Quarantined bytes are not part of the disk budget of stored artifacts (``kura_disk_used_bytes``);
they are reported as ``kura_storage_quarantine_bytes``. Not thread-safe: the storage writer
thread owns it.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from kura.core.manifest import Manifest

log = logging.getLogger(__name__)

RECORD_SUFFIX = ".json"


class Quarantine:
    """See module docstring. ``open()`` once (creates the directory, sums what is there)."""

    def __init__(self, directory: Path, max_bytes: int) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self.size_bytes = 0
        self.admitted_total = 0

    def open(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.size_bytes = sum(size for _path, size in self._files())
        self._trim()

    def admit(
        self,
        manifest: Manifest,
        *,
        blob: Path | None,
        inline_body: bytes | None,
        found: str,
        detected_by: str,
        now_ms: int,
    ) -> Path:
        """Move ``blob`` (a stored file) or write ``inline_body`` into the quarantine, with a
        JSON record beside it; returns the quarantined path (it may already be trimmed away).

        A missing ``blob`` is recorded without bytes. Raises OSError only if the record cannot
        be written; the stored file has then still been moved or removed.
        """
        # The suffix keeps two damages of one artifact in one millisecond apart.
        target = self.directory / f"{now_ms:015d}-{manifest.artifact_id}-{os.urandom(4).hex()}"
        size = 0
        if blob is not None:
            try:
                os.replace(blob, target)
                size = target.stat().st_size
            except FileNotFoundError:
                pass
        elif inline_body is not None:
            target.write_bytes(inline_body)
            size = len(inline_body)
        record = {
            "artifact_id": manifest.artifact_id,
            "producer": manifest.producer,
            "namespace_id": manifest.namespace_id,
            "key": manifest.key,
            "version_ms": manifest.version_ms,
            "expected_sha256": manifest.sha256,
            "expected_size": manifest.size,
            "found": found,
            "detected_by": detected_by,
            "quarantined_at_ms": now_ms,
        }
        target.with_name(target.name + RECORD_SUFFIX).write_text(json.dumps(record) + "\n")
        self.size_bytes += size
        self.admitted_total += 1
        self._trim()
        return target

    def _files(self) -> list[tuple[Path, int]]:
        """Quarantined blobs, oldest first (names start with a zero-padded ms stamp)."""
        out = []
        for path in sorted(self.directory.iterdir()):
            if path.name.endswith(RECORD_SUFFIX) or not path.is_file():
                continue
            try:
                out.append((path, path.stat().st_size))
            except FileNotFoundError:
                continue
        return out

    def _trim(self) -> None:
        if self.size_bytes <= self.max_bytes:
            return
        for path, size in self._files():
            if self.size_bytes <= self.max_bytes:
                break
            path.unlink(missing_ok=True)
            path.with_name(path.name + RECORD_SUFFIX).unlink(missing_ok=True)
            self.size_bytes -= size
            log.info("quarantine over %d bytes: deleted the oldest, %s", self.max_bytes, path.name)
