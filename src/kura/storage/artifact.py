"""What ``CacheService`` takes and returns: the name of an artifact (``ArtifactRef``), a body
ready to send (``StoredBody``), one body of a batch write (``BatchBlob``), the outcome of a
write (``PutResult``), and provenance's answers (``WriterUsage``, ``Purge``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import BinaryIO

from kura.core.manifest import Manifest
from kura.core.version import ApplyOutcome


@dataclass(frozen=True)
class ArtifactRef:
    """What a protocol names: producer (protocol family), namespace and key; and, for a write,
    ``writer``: who makes it (``kura.core.provenance``, recorded in the manifest). Two refs name
    the same artifact whoever writes it: ``writer`` takes no part in equality."""

    producer: str
    namespace_id: str
    key: str
    writer: str = field(default="", compare=False)


@dataclass(frozen=True)
class BatchBlob:
    """One body of a batch write (``storage.batch_write``): stored as ``ref``, it must hash to
    ``sha256`` (hex)."""

    ref: ArtifactRef
    data: bytes
    sha256: str


@dataclass
class StoredBody:
    """An artifact ready to send: ``data`` for small ones, else an open ``file``.

    ``data`` is always verified. A ``file`` whose size matched but whose bytes were not hashed
    yet has ``verified=False``: the sender must hash it while sending and abort on a mismatch
    (``kura.api.file_response``), against ``xxh3_128`` (hex, recorded at write time) when the
    row has one, else against ``manifest.sha256``. The caller must close ``file`` (``close()``
    does it and is idempotent).
    """

    manifest: Manifest
    data: bytes | None = None
    file: BinaryIO | None = None
    verified: bool = True
    xxh3_128: str | None = None

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


@dataclass(frozen=True)
class PutResult:
    """Outcome of a write. ``created`` is False when an earlier version existed."""

    manifest: Manifest
    created: bool
    outcome: ApplyOutcome


@dataclass(frozen=True)
class WriterUsage:
    """What one writer holds in one namespace on this node (``storage.ports.Provenance``):
    ``writer`` as recorded (``""`` for entries written before provenance was recorded), its
    ``entries`` and their ``bytes``, the newest version's ``last_version_ms`` (unix ms), and
    ``vias``: how this node got them, sorted: ``"local"`` for writes made here, else the
    internal URL of the peer each copy came from (pushed, bootstrapped, pulled, read through),
    or the apply path when no peer is known (``object_store`` for a bucket fill,
    ``replication`` for a push from a kura that does not name itself)."""

    writer: str
    entries: int
    bytes: int
    last_version_ms: int
    vias: tuple[str, ...]


@dataclass(frozen=True)
class Purge:
    """A purge of one writer's entries of one namespace (``ArtifactWriter.purge_writer``): its
    ``version_ms`` (every entry of that writer at or below it is gone, on every node, and a
    late copy at or below it is ignored), and the ``entries`` and ``bytes`` it deleted on this
    node."""

    version_ms: int
    entries: int
    bytes: int
