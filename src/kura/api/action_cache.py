"""Bazel action-cache entries: what an ``ActionResult`` upload must be, and what it references.

Rules (the Bazel HTTP cache, ``{prefix}/ac/{sha256}``):

* An upload is a serialized REAPI v2 ``ActionResult``
  (https://github.com/bazelbuild/remote-apis, ``remote_execution.proto``). One that does not
  parse, carries fields this version of the protocol does not define, or names a digest that is
  not 64 lowercase hex digits with a size >= 0 is refused (``InvalidRequest``, 400). A zero-byte
  upload is refused too: an empty protobuf parses, but a zero-length stored ActionResult is far
  more often a truncated write than a real result (buchgr/bazel-remote#121).
* A stored entry is a hit only while every CAS blob it references is stored, with the size
  its digest names (a digest is hash and size; a blob of another size does not count): the
  ``output_files[].digest``, ``stdout_digest``, ``stderr_digest``, every
  ``output_directories[].tree_digest`` and every file digest inside each referenced ``Tree``
  (root and children). Otherwise Bazel would take the hit and then fail fetching an output;
  bazel-remote answers such a lookup as a miss for the same reason (buchgr/bazel-remote#870,
  buchgr/bazel-remote PR #111 and #187). Symlinks reference no blob.
* The digest of the empty blob is always present (REAPI: servers must treat it as stored,
  clients need not upload it).
* ccache's ``layout=bazel`` stores its own result format under ``/ac/`` with a 64-hex key made by
  padding its 40-hex key with its first 24 hex digits (ccache/ccache#1511). Such keys
  (``is_ccache_key``) are stored and served raw, never parsed.

This module is pure parsing; ``bazel_http`` does the storage look-ups.
"""

from __future__ import annotations

import re

from google.protobuf import unknown_fields
from google.protobuf.message import DecodeError

from kura.core.errors import InvalidRequest
from kura.protos.build.bazel.remote.execution.v2 import (
    remote_execution_pb2 as reapi,
)

# gRPC's default maximum message size; an ActionResult Bazel sends over gRPC cannot be larger,
# and the HTTP cache's are the same messages. Bounds the in-memory parse.
MAX_ACTION_RESULT_BYTES = 4 * 1024 * 1024
EMPTY_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
_HASH = re.compile(r"[0-9a-f]{64}")


def is_ccache_key(key: str) -> bool:
    """True for ccache's padded 40-hex key (``key[40:64] == key[0:24]``, ccache/ccache#1511).

    A real SHA-256 has this shape with probability 2**-96.
    """
    return len(key) == 64 and key[40:64] == key[0:24]


def parse_action_result(data: bytes) -> reapi.ActionResult:
    """The ``ActionResult`` in ``data``. Raises ``InvalidRequest`` for a zero-byte body, bytes
    that do not parse, unknown top-level fields, or a malformed digest (see module rules)."""
    if not data:
        raise InvalidRequest(
            "an ActionResult upload must not be empty (a zero-byte entry is a truncated write)"
        )
    result = reapi.ActionResult()
    try:
        result.ParseFromString(data)
    except DecodeError as exc:
        raise InvalidRequest(f"body is not a REAPI v2 ActionResult: {exc}") from None
    if len(unknown_fields.UnknownFieldSet(result)):
        raise InvalidRequest("body is not a REAPI v2 ActionResult: it carries unknown fields")
    for digest in _direct_digests(result):
        _check_digest(digest)
    return result


def blob_references(result: reapi.ActionResult) -> list[tuple[str, int]]:
    """(SHA-256 hash, size in bytes) of the CAS blobs ``result`` names directly (outputs,
    stdout, stderr), without the empty blob; in field order, possibly with repeats."""
    return [
        (d.hash, d.size_bytes)
        for d in (
            *(f.digest for f in result.output_files),
            *((result.stdout_digest,) if result.HasField("stdout_digest") else ()),
            *((result.stderr_digest,) if result.HasField("stderr_digest") else ()),
        )
        if not _is_empty(d)
    ]


def tree_references(result: reapi.ActionResult) -> list[tuple[str, int]]:
    """(SHA-256 hash, size in bytes) of the ``Tree`` blobs of ``result``'s output directories,
    in order."""
    return [(d.tree_digest.hash, d.tree_digest.size_bytes) for d in result.output_directories]


def tree_file_references(data: bytes) -> list[tuple[str, int]] | None:
    """(hash, size in bytes) of every file in the serialized ``Tree`` ``data`` (root, then
    children), without the empty blob; None when ``data`` is not a valid ``Tree`` (the reference cannot be
    trusted, so the entry must read as a miss)."""
    tree = reapi.Tree()
    try:
        tree.ParseFromString(data)
    except DecodeError:
        return None
    digests: list[tuple[str, int]] = []
    for directory in (tree.root, *tree.children):
        for node in directory.files:
            if not _valid(node.digest):
                return None
            if not _is_empty(node.digest):
                digests.append((node.digest.hash, node.digest.size_bytes))
    return digests


def _direct_digests(result: reapi.ActionResult) -> list[reapi.Digest]:
    digests = [f.digest for f in result.output_files]
    digests += [d.tree_digest for d in result.output_directories]
    for name in ("stdout_digest", "stderr_digest"):
        if result.HasField(name):
            digests.append(getattr(result, name))
    return digests


def _valid(digest: reapi.Digest) -> bool:
    return bool(_HASH.fullmatch(digest.hash)) and digest.size_bytes >= 0


def _check_digest(digest: reapi.Digest) -> None:
    if not _valid(digest):
        raise InvalidRequest(
            f"ActionResult names digest {digest.hash[:80]!r}/{digest.size_bytes}: a digest must "
            "be 64 lowercase hex digits (SHA-256) with a size >= 0"
        )


def _is_empty(digest: reapi.Digest) -> bool:
    return digest.size_bytes == 0 and digest.hash == EMPTY_SHA256
