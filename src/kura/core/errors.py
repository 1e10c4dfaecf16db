"""The kura exception tree, organised by what the caller should do.

Every error a request can meet is one of these classes. ``kura.api.errors`` maps each class to
one HTTP status in a single table, so the same failure always yields the same status whichever
protocol met it. Messages are written for the client: they say what was wrong, never a stack.
"""

from __future__ import annotations


class KuraError(Exception):
    """Base class. ``message`` is safe to show to a client."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ForwardToPrimary(Exception):
    """Raised in a worker process (``kura.workers``) when it does not answer a request itself (a
    miss, a token it cannot check, anything but a GET or HEAD): the request goes to the primary
    process unchanged. Deliberately not a ``KuraError``: it never becomes a status."""


class InvalidRequest(KuraError):
    """The request is malformed: bad key, bad parameter, bad JSON. Do not retry unchanged."""


class Unauthenticated(KuraError):
    """No credentials, or credentials that match no configured token."""


class Forbidden(KuraError):
    """Valid credentials that do not allow this operation (a read-only token writing)."""


class NotFound(KuraError):
    """The artifact, upload or entry does not exist (or was evicted or failed verification)."""


class Conflict(KuraError):
    """The request conflicts with current state (for example parts that do not match)."""


class PayloadTooLarge(KuraError):
    """The body is larger than the route allows. ``limit_bytes`` is that limit."""

    def __init__(self, message: str, limit_bytes: int) -> None:
        super().__init__(message)
        self.limit_bytes = limit_bytes


class UnprocessableEntity(KuraError):
    """The request is well formed but cannot be applied (for example a multipart total over 2 GiB)."""


class DigestMismatch(InvalidRequest):
    """A content-addressed body does not hash to the digest it was stored under."""


class IncompleteBody(InvalidRequest):
    """The client stopped sending before the declared Content-Length was reached."""


class UnsupportedContentCoding(KuraError):
    """The body comes in a content coding the node does not take (``kura.api.body_codings``)."""


class UnsupportedTransferCoding(KuraError):
    """The body comes in a transfer coding the node does not decode (``kura.api.body_codings``)."""


class InsufficientStorage(KuraError):
    """The body can never fit: it is larger than the node's whole disk budget (field report
    B09: answer 507 rather than evicting everything trying to make room)."""


class ResourceExhausted(KuraError):
    """A bounded resource is full (tmp budget, disk, outbox). Retry after ``retry_after_seconds``."""

    def __init__(self, message: str, retry_after_seconds: int = 1) -> None:
        super().__init__(message)
        self.retry_after_seconds = retry_after_seconds


class Unavailable(KuraError):
    """The node cannot serve this now (draining, a dependency down). Retry later."""

    def __init__(self, message: str, retry_after_seconds: int = 1) -> None:
        super().__init__(message)
        self.retry_after_seconds = retry_after_seconds


class Corruption(KuraError):
    """Stored bytes do not match their recorded digest. The entry is dropped, never served."""


class ConfigurationError(KuraError):
    """Settings are invalid. ``problems`` lists every problem found, not just the first."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("invalid configuration: " + "; ".join(problems))
        self.problems = problems
