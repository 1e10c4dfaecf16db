"""The checks every received request body gets, in one place, whether it is staged in the tmp
dir (``storage.blobs.stage_body``) or read into memory (``storage.small_body.buffer_small``).

``BodyCount`` counts a body's bytes as its chunks arrive and refuses, as soon as the count says
so, a body past the route's limit (``PayloadTooLarge``, 413) or longer than its declared
length (``InvalidRequest``); at the end, one shorter than declared (``IncompleteBody``).
``check_sha256`` refuses a body whose SHA-256 is not the one expected (``DigestMismatch``, e.g.
Bazel's ``cas/`` path digest). Both paths therefore answer the same status with the same
message for the same body.
"""

from __future__ import annotations

from kura.core.errors import DigestMismatch, IncompleteBody, InvalidRequest, PayloadTooLarge


class BodyCount:
    """The running size of one body (``size``, bytes) against ``limit_bytes`` and
    ``declared_length`` (bytes; None: unknown, e.g. chunked). Not safe to share between
    bodies or tasks."""

    def __init__(self, *, limit_bytes: int, declared_length: int | None) -> None:
        self.limit_bytes = limit_bytes
        self.declared_length = declared_length
        self.size = 0

    def add(self, chunk: bytes) -> int:
        """Count ``chunk``; the size so far. Raises ``PayloadTooLarge`` past ``limit_bytes``
        (checked first), ``InvalidRequest`` past ``declared_length``."""
        self.size += len(chunk)
        if self.size > self.limit_bytes:
            raise PayloadTooLarge(
                f"body exceeds this route's limit of {self.limit_bytes} bytes", self.limit_bytes
            )
        if self.declared_length is not None and self.size > self.declared_length:
            raise InvalidRequest(
                f"body is longer than its declared Content-Length {self.declared_length}"
            )
        return self.size

    def finish(self) -> int:
        """The body ended: its size. Raises ``IncompleteBody`` when it is short of
        ``declared_length``."""
        if self.declared_length is not None and self.size != self.declared_length:
            raise IncompleteBody(
                f"body ended after {self.size} of {self.declared_length} declared bytes"
            )
        return self.size


def check_sha256(digest: str, expected_sha256: str | None) -> None:
    """Raise ``DigestMismatch`` when ``expected_sha256`` is given and is not ``digest`` (both
    lowercase hex)."""
    if expected_sha256 is not None and digest != expected_sha256:
        raise DigestMismatch(
            f"body hashes to sha256 {digest}, not the digest {expected_sha256} in its path"
        )
