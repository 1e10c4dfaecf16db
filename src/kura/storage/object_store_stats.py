"""Counters and error classification of the object-storage client (``storage.object_store``).

Labels come from closed sets: ``OPS`` (the request kinds) and ``RESULTS`` (how one ended).
``classify`` maps an obstore error to a result from its type and the S3 error code or transport
failure named in its message (S3 error codes:
https://docs.aws.amazon.com/AmazonS3/latest/API/ErrorResponses.html).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from obstore.exceptions import NotFoundError, PermissionDeniedError, UnauthenticatedError

OPS = ("put", "get", "head", "delete", "list")
RESULTS = (
    "ok",
    "not_found",
    "auth",
    "bucket_missing",
    "throttled",
    "server_error",
    "timeout",
    "unreachable",
    "error",
)
# Seconds; from 1 ms to about 33 s.
LATENCY_BUCKETS = tuple(0.001 * 2**i for i in range(16))
_STATUS = re.compile(r"status code: (\d{3})")


@dataclass
class ObjectStoreStats:
    """Plain counters the metrics layer reads at scrape time."""

    # (op, result) -> requests.
    requests_total: dict[tuple[str, str], int] = field(default_factory=dict)
    # op -> (counts per LATENCY_BUCKETS bucket (not cumulative) + the overflow, sum of seconds).
    latency: dict[str, tuple[list[int], float]] = field(default_factory=dict)
    upload_queue_depth: int = 0  # set by the uploader's passes; at least 1 after a write
    upload_oldest_age_seconds: float = 0.0  # set by the uploader
    upload_stalled: bool = False  # set by the uploader: failing while the disk is full
    uploaded_bytes_total: int = 0
    filled_bytes_total: int = 0

    def observe(self, op: str, result: str, seconds: float) -> None:
        key = (op, result)
        self.requests_total[key] = self.requests_total.get(key, 0) + 1
        counts, total = self.latency.get(op, ([0] * (len(LATENCY_BUCKETS) + 1), 0.0))
        i = next((i for i, b in enumerate(LATENCY_BUCKETS) if seconds <= b), len(LATENCY_BUCKETS))
        counts[i] += 1
        self.latency[op] = (counts, total + seconds)


def classify(exc: BaseException) -> str:
    """The ``RESULTS`` value for an obstore error, from its type and the S3 error code or
    transport failure in its message (S3 error codes:
    https://docs.aws.amazon.com/AmazonS3/latest/API/ErrorResponses.html)."""
    text = str(exc)
    if "NoSuchBucket" in text:
        return "bucket_missing"
    if isinstance(exc, PermissionDeniedError | UnauthenticatedError) or any(
        code in text for code in ("SignatureDoesNotMatch", "InvalidAccessKeyId", "AccessDenied")
    ):
        return "auth"
    if isinstance(exc, NotFoundError | FileNotFoundError):
        return "not_found"
    status = _STATUS.search(text)
    code = int(status.group(1)) if status else 0
    if "SlowDown" in text or code == 503:
        return "throttled"
    if 500 <= code < 600:
        return "server_error"
    lowered = text.lower()
    if "kind: Timeout" in text or "TimedOut" in text or "timed out" in lowered:
        return "timeout"
    if "kind: Connect" in text or "connection refused" in lowered:
        return "unreachable"
    if "error sending request" in lowered or "connection closed" in lowered:
        return "unreachable"  # reset or closed before an answer
    return "error"


def first_line(exc: BaseException) -> str:
    """A one-line description of an obstore error for a log line (no secrets: obstore never
    puts credentials in its messages; the URL holds only endpoint, bucket and key)."""
    lines = str(exc).strip().splitlines()
    return lines[0][:300] if lines else type(exc).__name__
