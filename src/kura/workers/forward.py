"""A worker hands a request to the primary: same method, path, query, headers and body, over a
unix socket, and relays the answer (status, headers, body) unchanged, streaming both ways.

Nothing is sent to the client before the primary answers, so the status and message the client
gets are the primary's (auth included: the primary checks the client's own ``Authorization``).
Hop-by-hop headers are not relayed (RFC 9110 §7.6.1). A body is forwarded with
``Expect: 100-continue``: it is read from the client and sent only once the primary asks for it,
so an upload the primary refuses early (413, 401) is refused before its body is read, as
without workers, and the connection is then closed, its body unread (RFC 9110 §10.1.1). A
client that sent ``Expect`` itself is given the ``100 Continue`` only when the primary gives it.

The upload limits hold here too, for this process holds the client's connection: when the
primary answers before the whole body came, from a client that stalled or trickled by the
listeners' one rule (``kura.api.upload_rate``), the connection is closed right after the answer
(as the primary closes its own), not kept for aiohttp's lingering read of the rest of the body.

A client that goes away mid-request (closes before its ``100 Continue``, or while its body or
the answer is under way) is told apart from a primary that failed: the first is the listeners'
quiet INFO line within its budget (``kura.api.malformed.log_client_gone``), never a WARNING
blaming the primary (issue 26: 400 cancelled uploads logged 124 such warnings).

A forward the primary refuses at its connection cap (``kura.api.connections``: the workers'
connections count against it) is answered with the cap's own 503, as the primary answers a
client it refuses. The primary sends that 503 and closes as it accepts, so writing the head
may fail (EPIPE) before the 503 is read; a connection the primary closed before answering and
before a byte of the body went to it, while the primary lives, is that refusal (only the
cap closes a connection it accepted without a word; its idle timeout closes one only after
an answer, and a pooled connection closed so is retried by aiohttp for idempotent methods).

When the primary vanishes mid-request, the client's connection is cut (or, if the primary is
alive but unreachable, answered 503) and the body writer's failure is logged on one line: it
never surfaces as an unretrieved task exception.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from yarl import URL

from kura.api.connections import cap_refusal
from kura.api.malformed import client_gone, log_client_gone
from kura.api.upload_rate import UploadMeter, UploadRule
from kura.settings import Settings

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
PRIMARY_DEATH_WAIT_SECONDS = 1.0


def _exited(pid: int) -> bool:
    """A process gone, or a zombie (state Z or X in /proc/PID/stat, proc(5))."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return True
    return stat.rpartition(b")")[2].split()[0] in (b"Z", b"X")


class _ForwardedRequest(aiohttp.ClientRequest):
    """aiohttp's request whose body-writer task never ends in an exception nobody retrieves.

    The task runs beside the response: when the primary's socket closes before or while the
    body goes out (``Cannot write to closing transport``), aiohttp has already closed the
    connection, so the response side fails (and is handled) on its own; the task's exception
    only said the same thing again, logged by asyncio with a traceback."""

    async def write_bytes(self, writer: Any, conn: Any, content_length: int | None = None) -> None:
        try:
            await super().write_bytes(writer, conn, content_length)
        except (aiohttp.ClientError, OSError) as exc:
            log.debug("sending a body to the primary failed: %s", exc)


class Forwarder:
    """Relays requests to the primary's unix socket ``path``. ``start()`` before use."""

    def __init__(self, path: str, primary_pid: int, settings: Settings) -> None:
        self.path = path
        self.primary_pid = primary_pid
        self.settings = settings
        self.forwarded_total = 0
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.UnixConnector(path=self.path, limit=0),
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
            request_class=_ForwardedRequest,
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def _primary_died(self) -> bool:
        """Whether the primary is dead or dying. Its sockets close before the kernel reparents
        this process (exit(2): files are closed, then the parent is told), so a refused
        connection is followed by a short wait for the sign that settles it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + PRIMARY_DEATH_WAIT_SECONDS
        while True:
            if os.getppid() != self.primary_pid or _exited(self.primary_pid):
                return True
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(0.02)

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        """Forward ``request`` (module docstring). The worker app's ``track_handlers`` keeps its
        task in the set a draining worker waits for: a relayed upload is not cut by the exit."""
        assert self._session is not None
        self.forwarded_total += 1
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP]
        expects = request.headers.get("Expect", "").lower() == "100-continue"
        # Timed from the request's start, a little before the primary's first read, so it
        # never judges more leniently than the primary does.
        meter = UploadRule.of(self.settings).meter(asyncio.get_running_loop().time())
        client = _ClientSide()
        body = _body(request, expects, meter, client) if request.body_exists else None
        if body is None:
            headers = [(k, v) for k, v in headers if k.lower() != "expect"]
        try:
            upstream = await self._session.request(
                request.method,
                URL("http://primary" + request.raw_path, encoded=True),  # the client's bytes
                headers=headers,
                data=body,
                allow_redirects=False,
                # Always: the primary may answer before the body (413, 401), and a request
                # still sending its body would not see that answer.
                expect100=body is not None,
                compress=None,
                chunked=True
                if body is not None and "Content-Length" not in request.headers
                else None,
            )
        except (aiohttp.ClientError, OSError) as exc:
            if client.gone is not None:  # the body failed on the client's side, not the primary's
                return _client_went_away(request, client.gone)
            if await self._primary_died():
                # The primary died: answer as the node would have, by dropping the connection
                # (a 503 from a node that just died would be a lie about what it stored).
                log.info(
                    "the primary died; cut the connection of %s %s: %s",
                    request.method,
                    request.path,
                    exc,
                )
                if request.transport is not None:
                    request.transport.abort()
                return web.Response(status=499)
            if _closed_unanswered(exc) and not client.sent:
                log.info(
                    "the primary refused %s %s at its connection cap", request.method, request.path
                )
                return cap_refusal()  # the primary's refusal (module docstring)
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
            unread = request.body_exists and not request.content.is_eof()
            if unread:
                response.force_close()  # the primary answered before the whole body came
            if upstream.headers.get("Connection", "").lower() == "close":
                response.force_close()
            await response.prepare(request)
            async for chunk in upstream.content.iter_chunked(CHUNK_BYTES):
                await response.write(chunk)
            await response.write_eof()
            loop = asyncio.get_running_loop()
            if (
                unread
                and request.transport is not None
                and meter.verdict(loop.time()) is not None  # the primary's rule gave up
            ):
                request.transport.close()  # flushes the answer first; no lingering read
            return response
        except (aiohttp.ClientError, OSError) as exc:
            if client_gone(exc):  # writing the answer to the client failed
                return _client_went_away(request, exc)
            # Bytes may be on their way: the only honest end is to cut the connection.
            log.info(
                "relaying %s %s from the primary failed: %s", request.method, request.path, exc
            )
            if request.transport is not None:
                request.transport.abort()
            return web.Response(status=499)
        finally:
            upstream.release()


class _ClientSide:
    """What ``_body`` saw of the client: ``gone``, the exception that said it went away."""

    gone: BaseException | None = None
    sent = False  # whether a byte of the body went to the primary


def _closed_unanswered(exc: BaseException) -> bool:
    """Whether ``exc`` says the primary closed a connection it had accepted (not one it never
    accepted: a connector error), before its answer."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        return False
    return isinstance(exc, (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError))


def _client_went_away(request: web.Request, exc: BaseException) -> web.StreamResponse:
    """The quiet end of a request whose client left: one budgeted INFO line, the connection
    dropped, and a response nobody will read."""
    log_client_gone("worker", f"{request.method} {request.path}: {exc}")
    if request.transport is not None:
        request.transport.abort()
    return web.Response(status=499)


async def _body(
    request: web.Request, expects: bool, meter: UploadMeter, client: _ClientSide
) -> AsyncIterator[bytes]:
    """The client's body, counted in ``meter``; with ``Expect: 100-continue`` the client is
    told to send it only now, when the primary asked for it. A failure here is the client's
    (noted in ``client``): aiohttp reports it as a failure to write to the primary."""
    try:
        if expects and request.writer is not None:
            await request.writer.write(CONTINUE)
        loop = asyncio.get_running_loop()
        async for chunk in request.content.iter_chunked(CHUNK_BYTES):
            meter.add(len(chunk), loop.time())
            client.sent = True
            yield chunk
    except Exception as exc:
        if client_gone(exc) or isinstance(exc, aiohttp.ClientError):
            client.gone = exc
        raise
