"""The blob-store seam: where the bytes of file-backed artifact versions live.

``BlobStore`` is the interface a storage tier implements: publish a staged file as one version's
blob, open it, remove it, list what is stored. ``storage.blobs.BlobFiles`` is the local-disk
implementation (one file per artifact version under ``DATA_DIR/blobs/``); a second tier (an
object store) implements the same four operations in its own module. The metadata index never
sees a blob store, and the blob store never sees the index (import-linter contracts in
``pyproject.toml``): ``CacheService`` is the one place that keeps the two in step.

Failure rules, for every implementation:

* ``put`` is called with a staging file that is already fsynced; when it returns, the blob is
  durable under ``manifest``'s version and readable by ``open_blob``. It never replaces another
  version's blob (the caller removes the old version only after the new row commits). On error
  it raises ``OSError`` and leaves no blob under that version (the staging file may remain; the
  caller removes it).
* ``open_blob`` raises ``FileNotFoundError`` when that version is not stored (the caller reads
  it as a miss). The caller verifies size and digest; the store does not.
* ``remove`` and ``remove_artifact`` are idempotent: removing what is absent is not an error.
  A reader that already opened a blob keeps reading the bytes it opened.
* Callers serialise ``put``/``remove``/``remove_artifact`` of one artifact (``CacheService``'s
  single writer thread); ``open_blob`` and ``artifact_ids`` may run concurrently with them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, Protocol, runtime_checkable

from kura.core.manifest import Manifest


@runtime_checkable
class BlobStore(Protocol):
    """Where file-backed artifact bodies live (module docstring: the failure rules)."""

    def put(self, staged_path: Path, manifest: Manifest) -> str | None:
        """Publish the fsynced file ``staged_path`` as the blob of exactly ``manifest``'s
        version. Returns the stored copy's change signature (a string that changes when its
        bytes may have: ``storage.blobs.stat_signature`` on disk), or None when the store has
        none. Raises ``OSError``."""
        ...

    def open_blob(self, manifest: Manifest) -> BinaryIO:
        """The blob of exactly ``manifest``'s version, open for reading from offset 0 (the
        caller closes it). Raises ``FileNotFoundError`` when it is not stored."""
        ...

    def remove(self, manifest: Manifest) -> None:
        """Remove the blob of exactly ``manifest``'s version, if stored."""
        ...

    def remove_artifact(self, artifact_id: str) -> None:
        """Remove every stored version of ``artifact_id`` (its row is gone)."""
        ...

    def artifact_ids(self) -> Iterator[str]:
        """The artifact ids with at least one stored blob, each once, in no particular order."""
        ...
