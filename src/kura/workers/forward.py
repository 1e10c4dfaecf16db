"""A worker hands a request to the primary: same method, path, query, headers and body, over a
unix socket, and relays the answer (status, headers, body) unchanged, streaming both ways.

Nothing is sent to the client before the primary answers, so the status and message the client
gets are the primary's (auth included: the primary checks the client's own ``Authorization``).
Hop-by-hop headers are not relayed (RFC 9110 §7.6.1). ``Expect: 100-continue`` is passed on and
the ``100 Continue`` is given to the client only when the primary gives it, so a refused upload
is refused before its body is sent, as without workers; the connection is then closed, its body
unread (RFC 9110 §10.1.1).
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web
from yarl import URL

log = logging.getLogger(__name__)

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
CHUNK_BYTES = 256 * 1024
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class Forwarder:
    """Relays requests to the primary's unix socket ``path``. ``start()`` before use."""

    def __init__(self, path: str, primary_pid: int) -> None:
        self.path = path
        self.primary_pid = primary_pid
        self.forwarded_total = 0
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.UnixConnector(path=self.path, limit=0),
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        self.forwarded_total += 1
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP]
        expects = request.headers.get("Expect", "").lower() == "100-continue"
        body = _body(request, expects) if request.body_exists else None
        if body is None:
            headers = [(k, v) for k, v in headers if k.lower() != "expect"]
        try:
            upstream = await self._session.request(
                request.method,
                URL("http://primary" + request.raw_path, encoded=True),  # the client's bytes
                headers=headers,
                data=body,
                allow_redirects=False,
                expect100=expects and body is not None,
                compress=None,
                chunked=True
                if body is not None and "Content-Length" not in request.headers
                else None,
            )
        except (aiohttp.ClientError, OSError) as exc:
            if os.getppid() != self.primary_pid:
                # The primary died: answer as the node would have, by dropping the connection
                # (a 503 from a node that just died would be a lie about what it stored).
                if request.transport is not None:
                    request.transport.abort()
                return web.Response(status=499)
            log.warning(
                "could not forward %s %s to the primary: %s", request.method, request.path, exc
            )
            return web.Response(
                status=503,
                text="the node's primary process is unavailable; retry\n",
                headers={"Retry-After": "1"},
            )
        try:
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for k, v in upstream.headers.items():
                if k.lower() not in HOP_BY_HOP:
                    response.headers.add(k, v)
            if request.body_exists and not request.content.is_eof():
                response.force_close()  # the primary answered before the whole body came
            if upstream.headers.get("Connection", "").lower() == "close":
                response.force_close()
            await response.prepare(request)
            async for chunk in upstream.content.iter_chunked(CHUNK_BYTES):
                await response.write(chunk)
            await response.write_eof()
            return response
        except (aiohttp.ClientError, OSError) as exc:
            # Bytes may be on their way: the only honest end is to cut the connection.
            log.info(
                "relaying %s %s from the primary failed: %s", request.method, request.path, exc
            )
            if request.transport is not None:
                request.transport.abort()
            return web.Response(status=499)
        finally:
            upstream.release()


async def _body(request: web.Request, expects: bool) -> AsyncIterator[bytes]:
    """The client's body; with ``Expect: 100-continue`` the client is told to send it only
    now, when the primary asked for it."""
    if expects and request.writer is not None:
        await request.writer.write(CONTINUE)
    async for chunk in request.content.iter_chunked(CHUNK_BYTES):
        yield chunk
