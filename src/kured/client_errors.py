"""HTTP client exceptions turned into the sentences ``kured status`` shows (issue 15: "Gate errors
are human sentences, not a raw client exception repr").

``unreachable(who, exc, timeout_seconds)`` answers e.g. ``"Prometheus at http://p:9090
unreachable: connection refused"`` or ``"gate http://k:4000/ready unreachable: no answer within
5s"``. The client library's own text is kept only where nothing better is known, without its
class name or repr.
"""

from __future__ import annotations

import socket

import aiohttp


def reason(exc: BaseException, timeout_seconds: float) -> str:
    """Why a request failed, as a short lower-case phrase (no trailing period)."""
    if isinstance(exc, TimeoutError | aiohttp.ServerTimeoutError):
        return f"no answer within {timeout_seconds:g}s"
    if isinstance(exc, aiohttp.ClientConnectorError):
        cause: BaseException = exc.os_error
        if isinstance(cause, socket.gaierror):
            return f"cannot resolve host {exc.host!r}"
        if isinstance(cause, ConnectionRefusedError):
            return "connection refused"
        return (
            cause.strerror.lower()
            if isinstance(cause, OSError) and cause.strerror
            else "cannot connect"
        )
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "the server closed the connection without answering"
    if isinstance(exc, aiohttp.ClientPayloadError):
        return "the answer was cut off"
    if isinstance(exc, aiohttp.ClientResponseError):
        return f"HTTP {exc.status} {exc.message}".strip()
    if isinstance(exc, aiohttp.InvalidURL):
        return "invalid URL"
    if isinstance(exc, UnicodeDecodeError | ValueError):
        return "the answer is not valid JSON"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return str(exc) or "request failed"


async def read_at_most(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """At most ``limit`` bytes of ``response``'s body (fewer only at its end): an answer of
    any size, or one that never ends, costs no more memory or time than that."""
    chunks: list[bytes] = []
    size = 0
    while size < limit:
        chunk = await response.content.read(limit - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def unreachable(who: str, exc: BaseException, timeout_seconds: float) -> str:
    """``"<who> unreachable: <reason>"`` (see ``reason``)."""
    return f"{who} unreachable: {reason(exc, timeout_seconds)}"
