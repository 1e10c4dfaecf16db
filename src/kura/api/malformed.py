"""The quiet policy for malformed input, on every listener (public and internal HTTP, each
worker's, gRPC).

A request kura cannot even parse (an HTTP request line or framing aiohttp refuses, a gRPC
message that is not the protobuf its method takes) gets its status (400, INVALID_ARGUMENT) and
at most one INFO line without a traceback, and those lines are rate-limited: at most
``LOG_LINES`` per ``LOG_INTERVAL_SECONDS`` per process, the next one saying how many were left
out (``kit.log_limit``). Any client can send such requests at will, so neither ERROR, nor a
traceback, nor a line each: 2,000 garbage gRPC calls once wrote 2,000 tracebacks (1.58 MB in
1.7 s) and filled the status page's list of recent errors (issue 26). INFO keeps them out of
that list (``kit.log_ring`` keeps WARNING and above).

A client that goes away mid-request (connection reset, a write to a closing transport, aiohttp's
``RuntimeError('Connection closed.')``) is the same kind of event: ``client_gone`` is the one test
for it, and ``log_client_gone`` its INFO line within a budget of its own. 400 clients that sent
``Expect: 100-continue`` and closed once logged 400 tracebacks at ERROR (issue 26).

A request that fails because the process is short of descriptors or memory for a file
(``short_of_resources``: EMFILE, ENFILE, ENOMEM) is answered "unavailable, retry" (503,
UNAVAILABLE) on every listener, and ``log_shortage`` writes one WARNING line per
``SHORTAGE_LOG_INTERVAL_SECONDS`` for all of them: the condition passes, and a line with a
traceback per request would flood the log while it lasts.
"""

from __future__ import annotations

import asyncio
import logging
import re

from aiohttp.http_exceptions import HttpProcessingError

from kit.log_limit import LogLimit
from kura.core.errors import ResourceExhausted
from kura.storage.fsync import SHORTAGE_ERRNOS

log = logging.getLogger(__name__)

LOG_LINES = 5
LOG_INTERVAL_SECONDS = 60.0
_LIMIT = LogLimit(LOG_LINES, LOG_INTERVAL_SECONDS)
_GONE_LIMIT = LogLimit(LOG_LINES, LOG_INTERVAL_SECONDS)
SHORTAGE_LOG_INTERVAL_SECONDS = 10.0
_SHORTAGE_LIMIT = LogLimit(1, SHORTAGE_LOG_INTERVAL_SECONDS)
_FULL_LIMIT = LogLimit(1, SHORTAGE_LOG_INTERVAL_SECONDS)
# Retry-After (seconds) of a request refused because the disk is full (module docstring).
DISK_FULL_RETRY_SECONDS = 10


def short_of_resources(exc: BaseException) -> bool:
    """Whether ``exc`` is an OSError for want of a descriptor or memory (module docstring)."""
    return isinstance(exc, OSError) and exc.errno in SHORTAGE_ERRNOS


def log_shortage(listener: str, what: str, exc: OSError) -> None:
    """One WARNING line for a request of ``listener`` (``what``: its method and path or gRPC
    method) answered unavailable for want of descriptors or memory, within the budget of one
    line per ``SHORTAGE_LOG_INTERVAL_SECONDS`` (the line counts the others). Any thread."""
    left_out = _SHORTAGE_LIMIT.admit()
    if left_out is not None:
        log.warning(
            "%s %s answered unavailable: %s (%d more such requests not logged)",
            listener,
            what,
            exc,
            left_out,
        )


def disk_full_error(listener: str, what: str, exc: BaseException) -> ResourceExhausted:
    """The answer to a request of ``listener`` (``what``: its method and path, or its gRPC
    method) that failed with ``storage.fsync.disk_full(exc)``: ``ResourceExhausted`` (503, ``Retry-After:
    DISK_FULL_RETRY_SECONDS``), after one WARNING line per ``SHORTAGE_LOG_INTERVAL_SECONDS``
    for all such requests (the line counts the others). Any thread."""
    left_out = _FULL_LIMIT.admit()
    if left_out is not None:
        log.warning(
            "%s %s answered 503: the disk is full (%s) (%d more such requests not logged)",
            listener,
            what,
            exc,
            left_out,
        )
    return ResourceExhausted(
        "the disk is full: the node cannot record this change now; retry once space is "
        "freed (eviction, or an operator)",
        retry_after_seconds=DISK_FULL_RETRY_SECONDS,
    )


def client_gone(exc: BaseException) -> bool:
    """Whether ``exc`` says the client's connection is gone: a reset or broken pipe (aiohttp's
    ``ClientConnectionResetError``, "Cannot write to closing transport", is a
    ``ConnectionResetError``), a body cut short, or the bare ``RuntimeError("Connection
    closed.")`` aiohttp raises when a read starts after the connection was lost (aiohttp 3.14
    ``streams.StreamReader._wait``)."""
    if isinstance(exc, (ConnectionError, asyncio.IncompleteReadError)):
        return True
    return isinstance(exc, RuntimeError) and str(exc) == "Connection closed."


def log_client_gone(listener: str, message: str) -> None:
    """One INFO line for a client of ``listener`` that went away mid-request, within the
    budget (module docstring). Safe to call from any thread."""
    suppressed = _GONE_LIMIT.admit()
    if suppressed is not None:
        more = f" ({suppressed} more not logged)" if suppressed else ""
        log.info("a %s client went away: %s%s", listener, message, more)


def _suffix(suppressed: int) -> str:
    return f" ({suppressed} more malformed requests not logged)" if suppressed else ""


# A parser's message about a malformed request quotes the offending line after its description
# ("Invalid header token: b'Authorization : Bearer ...'", "Unexpected whitespace after header
# value: b' s3cr3t'" of a folded header, "Bad status line 'GET /?token=...'"), and that line
# may hold a credential under any header name or in the query. Only the description is logged:
# the message is cut where the quoted line starts.
_QUOTED = re.compile(r"""(:\s*b?['"]|\sb?['"]|:\s*\n|\n)""")


def without_credentials(message: str) -> str:
    """``message`` without the line a parser quoted after its description (module comment
    above): a value that may be a credential is never shown."""
    m = _QUOTED.search(message)
    if m is not None:
        return message[: m.start()] + " (the line is not logged)"
    # aiohttp's Python parser gives some errors as the offending text alone (a bad URL).
    return message if " " in message.strip() else "(the offending text is not logged)"


def log_malformed(listener: str, message: str) -> None:
    """One INFO line for a malformed request on ``listener`` (``"gRPC"``, ``"HTTP"``) within the
    process's budget (module docstring); nothing once the budget of the interval is spent.
    Safe to call from any thread. (An HTTP parser's message goes through
    ``without_credentials`` first: ``_MalformedRequestFilter``.)"""
    suppressed = _LIMIT.admit()
    if suppressed is not None:
        log.info("rejected a malformed %s request: %s%s", listener, message, _suffix(suppressed))


class _MalformedRequestFilter(logging.Filter):
    """aiohttp logs every unparsable request (bad request line, conflicting framing headers)
    with a full traceback at ERROR. The client already got a 400; the record becomes the
    policy's INFO line without the traceback, or is dropped past the budget. So does a
    handler's failure because its client went away (``client_gone``), whatever the handler."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and client_gone(exc):
            log_client_gone("HTTP", f"{type(exc).__name__}: {exc}")
            return False
        if not isinstance(exc, HttpProcessingError):
            return True
        suppressed = _LIMIT.admit()
        if suppressed is None:
            return False
        record.msg = "rejected a malformed HTTP request: %s%s"
        record.args = (without_credentials(str(exc.message)), _suffix(suppressed))
        record.levelno, record.levelname = logging.INFO, "INFO"
        record.exc_info, record.exc_text = None, None
        return True


_MALFORMED = _MalformedRequestFilter()


def quiet_malformed_requests() -> None:
    """Apply the policy to aiohttp's unparsable requests. Every process that serves an HTTP
    listener calls it (``kura.api.http.serving_app``: the primary and each worker); calling it
    again does nothing."""
    logging.getLogger("aiohttp.server").addFilter(_MALFORMED)  # a set: added once
