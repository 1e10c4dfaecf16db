"""Instance names and ByteStream resource names of the REAPI CAS (remote_execution.proto,
"ByteStream API").

* Instance names select namespaces (``namespace_of``): ``""`` is the default namespace; any
  other is one or more ``/``-separated segments of letters, digits, ``.``, ``_`` and ``-`` (not
  starting with ``.``), and its namespace is the segments joined by ``~`` (``org/team-1`` is the
  namespace ``org~team-1``, which ``/ns/org~team-1/cache`` names over HTTP), at most 128
  characters. ``~`` is the separator, so it is refused inside an instance name, as are an empty
  segment and a segment the REAPI reserves for resource names (``RESERVED_SEGMENTS``): each
  would make two instance names one namespace, or a ByteStream name ambiguous.

* Read: ``{instance_name}/blobs/{hash}/{size}`` or
  ``{instance_name}/compressed-blobs/{compressor}/{hash}/{size}``.
* Write: ``{instance_name}/uploads/{uuid}/blobs/{hash}/{size}{/optional_metadata}`` or the same
  with ``compressed-blobs/{compressor}/``; the ``uploads/{uuid}/`` part may be left out (older
  clients write to ``blobs/...`` directly), and then the write cannot be told apart from another
  client's write of the same blob, so it is not resumable.

``instance_name`` may be empty (the name then starts with ``blobs/`` or ``uploads/``) or span
several segments (``org/team-1/blobs/...``): it is everything before the first segment that is
``uploads``, ``blobs`` or ``compressed-blobs``, which no instance name may contain
(``namespace_of``, which also maps it to its namespace). The compressors are
``identity`` and ``zstd`` (``kura.grpc.zstd_stream``); any other is INVALID_ARGUMENT, as is a
name of any other shape, a hash that is not 64 lowercase hex digits or a size that is not a decimal
integer >= 0.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kura.core.errors import InvalidRequest
from kura.core.keys import HEX_SHA256, NAMESPACE, validate

MAX_NAME_CHARS = 1024
# remote_execution.proto (ByteStream API): "a path segment cannot equal any of the following
# keywords", so that a resource name parses one way.
RESERVED_SEGMENTS = frozenset(
    {
        "blobs",
        "uploads",
        "actions",
        "actionResults",
        "operations",
        "capabilities",
        "compressed-blobs",
    }
)
SEGMENT = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")
SEPARATOR = "~"  # joins an instance name's segments into its namespace
MAX_INSTANCE_NAME_CHARS = 128  # its namespace's length (kura.core.keys.NAMESPACE)


def namespace_of(instance_name: str) -> str:
    """The namespace an instance name selects (module rules), e.g. ``"org/team-1"`` →
    ``"org~team-1"``; ``InvalidRequest`` saying why otherwise."""
    if not instance_name:
        return ""
    shown = instance_name if len(instance_name) <= 80 else instance_name[:77] + "..."
    if len(instance_name) > MAX_INSTANCE_NAME_CHARS:
        raise InvalidRequest(
            f"invalid instance name {shown!r}: longer than {MAX_INSTANCE_NAME_CHARS} characters"
        )
    for segment in instance_name.split("/"):
        if not segment:
            raise InvalidRequest(
                f"invalid instance name {shown!r}: an empty segment (a leading, trailing or "
                "doubled '/')"
            )
        if segment in RESERVED_SEGMENTS:
            raise InvalidRequest(
                f"invalid instance name {shown!r}: the segment {segment!r} is reserved by the "
                "REAPI for resource names (" + ", ".join(sorted(RESERVED_SEGMENTS)) + ")"
            )
        if not SEGMENT.fullmatch(segment):
            why = (
                f"'{SEPARATOR}' joins segments into the namespace: separate segments with '/'"
                if SEPARATOR in segment
                else "a segment is letters, digits, '.', '_' and '-', not starting with '.'"
            )
            raise InvalidRequest(f"invalid instance name {shown!r}: {why}")
    return validate(instance_name.replace("/", SEPARATOR), NAMESPACE, "instance name")


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
