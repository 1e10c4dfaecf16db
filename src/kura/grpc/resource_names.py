"""ByteStream resource names of the REAPI CAS (remote_execution.proto, "ByteStream API").

* Read: ``{instance_name}/blobs/{hash}/{size}`` or
  ``{instance_name}/compressed-blobs/{compressor}/{hash}/{size}``.
* Write: ``{instance_name}/uploads/{uuid}/blobs/{hash}/{size}{/optional_metadata}`` or the same
  with ``compressed-blobs/{compressor}/``; the ``uploads/{uuid}/`` part may be left out (older
  clients write to ``blobs/...`` directly), and then the write cannot be told apart from another
  client's write of the same blob, so it is not resumable.

``instance_name`` may be empty (the name then starts with ``blobs/`` or ``uploads/``) or span
several segments (``org/team-1/blobs/...``): it is everything before the first segment that is
``uploads``, ``blobs`` or ``compressed-blobs``, which no instance name may contain
(``kura.grpc.common.namespace_of``, which also maps it to its namespace). The compressors are
``identity`` and ``zstd`` (``kura.grpc.zstd_stream``); any other is INVALID_ARGUMENT, as is a
name of any other shape, a hash that is not 64 lowercase hex digits or a size that is not a decimal
integer >= 0.
"""

from __future__ import annotations

from dataclasses import dataclass

from kura.core.errors import InvalidRequest
from kura.core.keys import HEX_SHA256, validate
from kura.grpc.common import namespace_of

MAX_NAME_CHARS = 1024
IDENTITY = "identity"
COMPRESSORS = (IDENTITY, "zstd")


@dataclass(frozen=True)
class BlobName:
    """A parsed name: namespace, the blob's SHA-256 and size, and the upload's uuid (writes)."""

    namespace: str
    sha256: str
    size_bytes: int
    upload_id: str = ""
    compressor: str = IDENTITY

    @property
    def session_key(self) -> tuple[str, str, str, int, str]:
        return (self.namespace, self.upload_id, self.sha256, self.size_bytes, self.compressor)


def parse_read(name: str) -> BlobName:
    """A Read name (module rules); ``InvalidRequest`` otherwise."""
    parts = _split(name)
    start = _find(parts, ("blobs", "compressed-blobs"), name)
    (sha256, size, compressor), rest = _blob(parts[start:], name)
    if rest:
        raise InvalidRequest(f"resource name {_shown(name)!r} has segments after the size")
    return BlobName(namespace_of("/".join(parts[:start])), sha256, size, compressor=compressor)


def parse_write(name: str) -> BlobName:
    """A Write name (module rules); ``InvalidRequest`` otherwise."""
    parts = _split(name)
    start = _find(parts, ("uploads", "blobs", "compressed-blobs"), name)
    namespace = namespace_of("/".join(parts[:start]))
    upload_id = ""
    tail = parts[start:]
    if tail[0] == "uploads":
        if len(tail) < 2 or not tail[1]:
            raise InvalidRequest(f"resource name {_shown(name)!r} has no upload id after uploads/")
        upload_id = tail[1]
        tail = tail[2:]
    (sha256, size, compressor), _metadata = _blob(tail, name)
    return BlobName(namespace, sha256, size, upload_id=upload_id, compressor=compressor)


def _split(name: str) -> list[str]:
    if len(name) > MAX_NAME_CHARS:
        raise InvalidRequest(f"resource name is longer than {MAX_NAME_CHARS} characters")
    return name.split("/")


def _find(parts: list[str], words: tuple[str, ...], name: str) -> int:
    # An instance name has no reserved segment, so the first keyword ends it (REAPI grammar).
    for i, part in enumerate(parts):
        if part in words:
            return i
    raise InvalidRequest(
        f"resource name {_shown(name)!r} is not [instance/]"
        + ("uploads/{uuid}/" if "uploads" in words else "")
        + "blobs/{hash}/{size}"
    )


def _blob(tail: list[str], name: str) -> tuple[tuple[str, int, str], list[str]]:
    compressor = IDENTITY
    if tail and tail[0] == "compressed-blobs":
        compressor = tail[1] if len(tail) > 1 else ""
        if compressor not in COMPRESSORS:
            raise InvalidRequest(
                f"compressor {compressor[:40]!r} is not supported: only "
                + " and ".join(COMPRESSORS)
                + " are"
            )
        tail = tail[2:]
    elif tail and tail[0] == "blobs":
        tail = tail[1:]
    else:
        raise InvalidRequest(f"resource name {_shown(name)!r} names no blobs/{{hash}}/{{size}}")
    if len(tail) < 2:
        raise InvalidRequest(f"resource name {_shown(name)!r} lacks the hash or the size")
    sha256 = validate(tail[0], HEX_SHA256, "digest hash")
    if not tail[1].isdecimal() or not tail[1].isascii() or len(tail[1]) > 19:
        raise InvalidRequest(f"size {tail[1][:40]!r} in the resource name is not a byte count")
    return (sha256, int(tail[1]), compressor), tail[2:]


def _shown(name: str) -> str:
    return name if len(name) <= 120 else name[:117] + "..."
