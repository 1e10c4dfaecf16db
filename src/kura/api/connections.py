"""The node's open connections: one cap for every listener, and a quiet accept loop.

Field report: 1,100 idle connections under a 1,024-descriptor limit made ``/up`` time out and
wrote 166,623 tracebacks (74 MB of log) in 30 s. Once the process is out of descriptors,
asyncio's accept loop fails with EMFILE, logs it with a traceback, pauses one second and tries
again (CPython ``selector_events._accept_connection``), and no new client, ``/up`` included,
gets in. Three parts keep that from happening:

* ``descriptor_cap`` raises the soft ``RLIMIT_NOFILE`` to the hard limit at start and clamps
  ``KURA_MAX_CONNECTIONS`` below it, keeping a reserve (a quarter of the limit, at least
  ``MIN_RESERVED_DESCRIPTORS``) for SQLite, the WAL's fsync, peer connections and the
  executor, so ``accept`` itself never runs out. A busy connection costs
  ``DESCRIPTORS_PER_CONNECTION`` descriptors, not one: its socket, and the file its upload is
  staged in or its download is sent from (or, in a worker, its connection to the primary).
* ``ConnectionGuard`` counts every open connection of every listener of the process, admitting
  each in ``accept`` itself (``GuardedSocket``, the listeners' sockets): in the primary the
  public and internal ports and the unix socket the workers forward requests to, in a worker
  its share of the public port. uvloop accepts in libuv without calling ``accept``; there a
  connection is admitted when it reaches aiohttp instead (``ConnectionGuard.opened``). At the
  cap it closes the connection that has waited longest for a request head (idle keep-alive, or
  a client that never finished its head), so that a real request such as ``/up`` still gets
  in; with none waiting, it answers the new connection ``503`` and closes it. A running
  handler is never closed.
* ``AcceptErrorFilter`` turns asyncio's accept-error reports into one line per
  ``ACCEPT_ERROR_LOG_INTERVAL_SECONDS`` without the traceback, should the limit be reached anyway
  (descriptors used elsewhere in the process), and ``GuardedSocket`` lets such an error through
  once and then rests the socket until asyncio re-arms it a second later: CPython 3.11's
  ``_accept_connection`` keeps calling ``accept`` after an EMFILE for the rest of its backlog
  (1,024 calls) and schedules one re-arm for each (issue 26 counted about 36,000 failed
  accepts a second; here 114,065 in 10 s, and 2,731 tracebacks when the node stopped).
* ``ConnectionGuard.grpc_options`` carves the gRPC listener's share out of the same cap
  (``GRPC_SHARE_DIVISOR``): grpcio's C-core accepts on its own threads, so its share is its
  ``grpc.max_allowed_incoming_connections`` (a connection past it is closed as soon as it is
  accepted), and the HTTP listeners keep the rest. Without it, 4,500 idle connections to the
  gRPC port, each sending only the HTTP/2 preface, took every descriptor of the process, and the
  WAL's fsync could not open its file (issue 26).

The header-read timeout is aiohttp's keep-alive timeout (``GuardedAppRunner`` is given
``keepalive_timeout``): aiohttp arms it when a connection opens and after every response, and
closes the connection when it fires while no complete request head has arrived
(aiohttp ``web_protocol.RequestHandler._process_keepalive``). gRPC gets the same timeout twice,
capped at ``GRPC_IDLE_TIMEOUT_SECONDS``: ``grpc.server_handshake_timeout_ms`` closes a connection
that has not finished its HTTP/2 handshake (a preface and its SETTINGS frame) within it, and
``grpc.max_connection_idle_ms`` one with no call in progress for as long (grpcio 1.85: a socket
sending only the preface's magic is closed by the first, one that adds SETTINGS by the second).
The cap is shorter than the HTTP timeout because grpcio, at its connection cap, closes the
newcomer rather than the connection idle longest (the HTTP guard's way): sockets that sent only
the preface held every gRPC client out for the whole 60 s (issue 26), now 10 s at most. What is left: an attacker
that reopens its sockets every 10 s keeps the gRPC share, but not the HTTP listeners.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import resource
import socket
import stat
import time
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from kura.api.metrics import Scraped, counter, gauge
from kura.storage.fsync import SHORTAGE_ERRNOS

log = logging.getLogger(__name__)

MIN_RESERVED_DESCRIPTORS = 64
DESCRIPTORS_PER_CONNECTION = 2  # its socket and one file (module docstring)
# RLIM_INFINITY as a soft limit is refused by Linux (fs.nr_open bounds it); never ask for more.
MAX_SOFT_DESCRIPTORS = 1 << 20
ACCEPT_ERROR_LOG_INTERVAL_SECONDS = 10.0
# After a failed accept for want of resources a listening socket rests this long. asyncio itself
# re-arms it after 1 s (asyncio.constants.ACCEPT_RETRY_DELAY); resting less lets that retry run.
ACCEPT_PAUSE_SECONDS = 0.5
_ACCEPT_SHORTAGE = SHORTAGE_ERRNOS | {errno.ENOBUFS}
# With the gRPC port on, a quarter of the cap is its share: build tools open many HTTP
# connections (Bazel's --remote_max_connections is 100 by default) but multiplex gRPC calls
# over a few channels.
GRPC_SHARE_DIVISOR = 4
# A gRPC connection that has not finished its HTTP/2 handshake (its preface and SETTINGS) within
# this many seconds, or has had no call in progress for as long, is closed, unless
# KURA_HEADER_READ_TIMEOUT_SECONDS is shorter (module docstring). A client sends preface and
# SETTINGS together and is done in one round trip (milliseconds; TLS adds one or two), and a
# channel closed while idle is reopened by the client at its next call (one round trip): 10 s
# is far past any real client, and frees the gRPC share 6 times sooner than 60 s did.
GRPC_IDLE_TIMEOUT_SECONDS = 10.0
_REFUSAL_BODY = b"connection limit reached; retry later\n"
REFUSAL = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nRetry-After: 1\r\n"
    b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(_REFUSAL_BODY), _REFUSAL_BODY)
)


def cap_refusal() -> web.Response:
    """The cap's 503 (``REFUSAL``) as a response, for a worker relaying the primary's refusal
    of the connection it forwards over (``kura.workers.forward``); the connection is closed
    after it, as the cap closes its own."""
    response = web.Response(
        status=503, body=_REFUSAL_BODY, content_type="text/plain", headers={"Retry-After": "1"}
    )
    response.force_close()
    return response


def descriptor_cap(configured: int) -> tuple[int, int]:
    """Raise the soft descriptor limit to the hard one; return ``(effective cap, limit)``.

    The cap is ``configured`` clamped to ``(limit - reserve) // DESCRIPTORS_PER_CONNECTION``
    (reserve: a quarter of the limit, at least ``MIN_RESERVED_DESCRIPTORS``), and at least 1.
    Process-wide; call once at start.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = MAX_SOFT_DESCRIPTORS if hard == resource.RLIM_INFINITY else hard
    target = min(target, MAX_SOFT_DESCRIPTORS)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("could not raise the descriptor limit from %d to %d: %s", soft, target, exc)
    reserve = max(MIN_RESERVED_DESCRIPTORS, soft // 4)
    return max(1, min(configured, (soft - reserve) // DESCRIPTORS_PER_CONNECTION)), soft


def _waiting_since(handler: RequestHandler) -> float | None:
    """When ``handler`` started waiting for a request head (loop time), or None while it is
    busy: a request parsed and queued, or one being handled (reading its body, running its
    handler, sending its response). A connection just accepted counts as waiting from when it
    opened.

    aiohttp has no public idle state: a request is in hand exactly while ``_messages`` holds it
    or ``_request_in_progress`` is set, and ``_next_keepalive_close_time`` is the keep-alive
    deadline armed when the connection opened or last answered (aiohttp 3.14
    ``web_protocol.RequestHandler.start``). Unknown attributes count as busy: never close what
    cannot be shown idle.
    """
    if getattr(handler, "_request_in_progress", True) or getattr(handler, "_messages", True):
        return None
    deadline = getattr(handler, "_next_keepalive_close_time", None)
    if not isinstance(deadline, float):
        return None
    return deadline - handler.keepalive_timeout


class ConnectionGuard:
    """Open connections of one node (both listeners). Event-loop confined.

    Admission happens in ``accept`` itself (``GuardedSocket``): asyncio accepts up to a whole
    backlog of connections in one loop iteration before any of them reaches aiohttp, so a cap
    applied later would let a burst exhaust the descriptors first. The count is exact: every
    accepted socket until it is closed, whether it ever reached aiohttp (a failed TLS handshake
    does not) or not.
    """

    def __init__(self, max_connections: int) -> None:
        self.max_connections = max_connections
        self._accepted: dict[int, socket.socket] = {}  # fd -> accepted socket, until closed
        self._closing: set[int] = set()  # fds of connections closed to make room
        self._handlers: set[RequestHandler] = set()
        # Connections accepted without GuardedSocket.accept (uvloop: libuv accepts by itself),
        # admitted when they reach aiohttp instead, until closed.
        self._late: set[RequestHandler] = set()
        self.closed_idle_total = 0
        self.refused_total = 0
        self.grpc_max_connections = 0  # the gRPC listener's share, once carved (grpc_options)

    @property
    def open_connections(self) -> int:
        self._prune()
        return len(self._accepted) + len(self._late)

    def apply_descriptor_limit(self) -> None:
        """Clamp the cap to the descriptor limit (``descriptor_cap``) and log the result."""
        configured = self.max_connections
        self.max_connections, limit = descriptor_cap(configured)
        log.info(
            "connection cap %d (KURA_MAX_CONNECTIONS=%d, descriptor limit %d)",
            self.max_connections,
            configured,
            limit,
        )

    def grpc_options(self, idle_timeout_seconds: float) -> list[tuple[str, int]]:
        """Carve the gRPC listener's share out of the cap and return grpcio server options
        that hold it to that share: ``(name, value)`` pairs for ``grpc.aio.server(options=)``.

        The share is a ``GRPC_SHARE_DIVISOR``-th of the cap (at least 1), and the HTTP
        listeners' cap shrinks by as much, so the process keeps its descriptor reserve whatever
        mix of listeners is attacked. Call once, after ``apply_descriptor_limit`` and before
        the gRPC server is made. ``idle_timeout_seconds`` bounds both a connection's HTTP/2
        handshake and a connection with no call in progress, at most ``GRPC_IDLE_TIMEOUT_SECONDS``
        (module docstring). The option
        names are grpc C-core's (``grpc/impl/channel_arg_names.h``)."""
        share = max(1, self.max_connections // GRPC_SHARE_DIVISOR)
        if self.max_connections > 1:
            self.max_connections = max(1, self.max_connections - share)
        self.grpc_max_connections = share
        idle_ms = max(1, int(min(idle_timeout_seconds, GRPC_IDLE_TIMEOUT_SECONDS) * 1000))
        return [
            ("grpc.max_allowed_incoming_connections", share),
            ("grpc.server_handshake_timeout_ms", idle_ms),
            ("grpc.max_connection_idle_ms", idle_ms),
        ]

    def collector(self) -> Scraped:
        """This process's connection families; across worker processes they are summed (each
        has its own cap), but the gRPC share is the primary's (only it serves gRPC)."""
        return Scraped(
            gauge(
                "kura_http_open_connections",
                "Open connections, both listeners.",
                lambda: self.open_connections,
            ),
            gauge(
                "kura_http_max_connections",
                "Effective connection cap of the HTTP listeners (KURA_MAX_CONNECTIONS clamped to "
                "the descriptor limit, less the gRPC listener's share).",
                lambda: self.max_connections,
            ),
            gauge(
                "kura_grpc_max_connections",
                "The gRPC listener's share of the connection cap (0 without the gRPC port).",
                lambda: self.grpc_max_connections,
            ),
            counter(
                "kura_http_connections_closed_at_cap",
                "Connections waiting for a request head closed to make room at the cap.",
                lambda: self.closed_idle_total,
            ),
            counter(
                "kura_http_connections_refused_at_cap",
                "New connections answered 503 at the cap because none was idle.",
                lambda: self.refused_total,
            ),
            across_processes={"kura_grpc_max_connections": "primary"},
        )

    def has_room(self) -> bool:
        """Whether one more connection fits under the cap now."""
        if len(self._accepted) + len(self._late) >= self.max_connections:
            self._prune()
        return len(self._accepted) + len(self._late) < self.max_connections

    def track(self, conn: socket.socket) -> None:
        """Count an accepted socket until it is closed."""
        self._accepted[conn.fileno()] = conn

    def make_room(self) -> bool:
        """Close the connection that has waited longest for a request head. True if one is
        closing now (its descriptor is free by the next loop iteration)."""
        if self._closing:
            return True
        victim: RequestHandler | None = None
        oldest = float("inf")
        for handler in self._handlers:
            since = _waiting_since(handler)
            if since is not None and since < oldest:
                victim, oldest = handler, since
        if victim is None:
            return False
        self._handlers.discard(victim)
        transport = victim.transport
        raw = transport.get_extra_info("socket") if transport is not None else None
        if raw is not None:
            self._closing.add(raw.fileno())
        victim.force_close()
        if transport is not None:
            transport.abort()  # a response the client never read must not delay the close
        self.closed_idle_total += 1
        return True

    def refuse(self, conn: socket.socket) -> None:
        """Answer ``conn`` 503 and close it now (no descriptor is kept)."""
        self.refused_total += 1
        try:
            conn.setblocking(False)
            with contextlib.suppress(BlockingIOError, InterruptedError):
                # Read what the client already sent, so the close is a FIN, not a reset that
                # could discard the answer.
                while conn.recv(65536):
                    pass
            conn.send(REFUSAL)
        except OSError:
            pass
        finally:
            conn.close()

    def opened(self, handler: RequestHandler, transport: Any) -> None:
        """A connection reached aiohttp. One that ``accept`` did not admit (uvloop accepts in
        libuv, never calling ``GuardedSocket.accept``) is admitted here: counted, and at the
        cap it makes room or is answered 503 and closed, as in ``GuardedSocket.accept``. Its
        descriptor existed for a moment, so a burst can pass the cap briefly under uvloop."""
        raw = transport.get_extra_info("socket") if transport is not None else None
        if raw is not None and raw.fileno() in self._accepted:
            self._handlers.add(handler)
            return
        if not self.has_room() and not self.make_room():
            self.refused_total += 1
            transport.write(REFUSAL)
            # aiohttp creates the handler's task after this call, and that task must see the
            # connection open (it asserts so) but handle no request: force_close, queued
            # before the task's first step, stops its loop before any request and closes the
            # transport (the refusal is flushed first).
            asyncio.get_running_loop().call_soon(handler.force_close)
            return
        self._late.add(handler)
        self._handlers.add(handler)

    def closed(self, handler: RequestHandler) -> None:
        self._handlers.discard(handler)
        self._late.discard(handler)

    def _prune(self) -> None:
        for fd, conn in list(self._accepted.items()):
            if conn.fileno() == -1:
                del self._accepted[fd]
        self._closing &= self._accepted.keys()


class GuardedSocket(socket.socket):
    """A listening socket whose ``accept`` asks the guard first.

    At the cap it makes room (closing the longest-idle connection) and reports "nothing to
    accept" for this loop iteration: asyncio then waits for the next readiness event
    (CPython ``selector_events._accept_connection`` treats ``BlockingIOError`` as an empty
    queue), by which time the closed connection's descriptor is free. With nothing idle it
    accepts and refuses with 503, so the queue drains instead of spinning.

    An accept that fails for want of descriptors or memory (EMFILE, ENFILE, ENOBUFS, ENOMEM)
    is raised once, so asyncio reports it (``AcceptErrorFilter``) and re-arms the socket a
    second later; until ``ACCEPT_PAUSE_SECONDS`` have passed, further calls report "nothing to
    accept" without trying (module docstring: asyncio would otherwise retry at once).
    """

    guard: ConnectionGuard
    _resting_until = 0.0  # monotonic time: no accept is tried before it

    def accept(self) -> tuple[socket.socket, Any]:
        if time.monotonic() < self._resting_until:
            raise BlockingIOError("resting after a failed accept")
        try:
            return self._admit()
        except OSError as exc:
            if exc.errno in _ACCEPT_SHORTAGE:
                self._resting_until = time.monotonic() + ACCEPT_PAUSE_SECONDS
            raise

    def _admit(self) -> tuple[socket.socket, Any]:
        guard = self.guard
        while True:
            if guard.has_room():
                conn, addr = super().accept()
                guard.track(conn)
                return conn, addr
            if guard.make_room():
                raise BlockingIOError("at the connection cap; room is being made")
            conn, _addr = super().accept()  # BlockingIOError when the queue is empty
            guard.refuse(conn)


def listening_sockets(
    guard: ConnectionGuard, host: str, port: int, *, reuse_port: bool = False
) -> list[socket.socket]:
    """Bound (not yet listening) ``GuardedSocket``s for ``host:port``, one per address the host
    resolves to, as ``loop.create_server`` would bind them (``SO_REUSEADDR``; IPv6 only on
    IPv6 sockets). ``reuse_port`` adds ``SO_REUSEPORT``, so that several processes bind the
    same port and the kernel spreads new connections over them (socket(7); ``kura.workers``).
    Raises OSError when an address cannot be bound."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _name, address in dict.fromkeys(
            (i[0], i[1], i[2], "", i[4]) for i in infos
        ):
            sock = GuardedSocket(family, kind, proto)
            sock.guard = guard
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if reuse_port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
    except OSError:
        for bound in sockets:
            bound.close()
        raise
    return sockets


def unix_listening_socket(guard: ConnectionGuard, path: str) -> socket.socket:
    """A bound (not yet listening) ``GuardedSocket`` on the unix socket ``path`` (an old socket
    there, left by a crash, is removed first), so the connections made to it count against
    ``guard``: the workers' forwarded requests (``kura.workers``) hold the primary's
    descriptors too, and without it N workers could make the primary hold N times its cap.
    Raises OSError, one that names the path when something other than a socket is there (a
    file, a directory, a symlink: never removed, it is not what a crash leaves)."""
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISSOCK(found.st_mode):
            raise OSError(
                errno.EEXIST,
                "something other than a socket is there: move it away, kura makes this socket",
                path,
            )
        os.unlink(path)
    sock = GuardedSocket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.guard = guard
    try:
        sock.bind(path)
    except OSError:
        sock.close()
        raise
    return sock


def refuse_if_taken(host: str, port: int) -> None:
    """Raise ``OSError(EADDRINUSE)`` when another process listens on ``host:port``.

    ``SO_REUSEPORT`` lets every socket of the same user that sets it bind one port (socket(7)),
    so a second kura node with workers, given the same port by mistake, would bind it beside
    the first and take half of its connections, answering 404 for the first node's artifacts.
    A probe without ``SO_REUSEPORT`` cannot bind a port that anyone listens on, so the primary
    binds one (and closes it) before it binds its own; a one-process node needs no probe,
    since it never sets the option. Port 0 (the kernel picks a free one) is never taken."""
    if port == 0:
        return
    for probe in listening_sockets(ConnectionGuard(1), host, port):
        probe.close()


class GuardedServer(web.Server):
    """aiohttp's low-level server, reporting each connection to a ``ConnectionGuard``."""

    def __init__(self, guard: ConnectionGuard, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._guard = guard

    def connection_made(self, handler: RequestHandler, transport: Any) -> None:
        super().connection_made(handler, transport)
        self._guard.opened(handler, transport)

    def connection_lost(self, handler: RequestHandler, exc: BaseException | None = None) -> None:
        self._guard.closed(handler)
        super().connection_lost(handler, exc)


class GuardedAppRunner(web.AppRunner):
    """An ``AppRunner`` whose connections count against ``guard``.

    aiohttp offers no hook for a connection's arrival except its ``Server``; this rebuilds the
    server the app made with the same arguments (aiohttp 3.14 ``AppRunner._make_server``).

    Its parser never inflates a request body (``auto_decompress=False``): kura takes no
    ``Content-Encoding`` (``kura.api.body_codings`` refuses one before the body is read), and
    aiohttp otherwise inflates the bytes as they arrive, read or not, logging a bogus gzip
    body's error as an "Unhandled exception" with a traceback.
    """

    def __init__(self, app: web.Application, guard: ConnectionGuard, **kwargs: Any) -> None:
        super().__init__(app, **{"auto_decompress": False, **kwargs})
        self._guard = guard

    async def _make_server(self) -> web.Server:
        made = await super()._make_server()
        return GuardedServer(
            self._guard,
            made.request_handler,
            request_factory=made.request_factory,
            handler_cancellation=made.handler_cancellation,
            **made._kwargs,
        )


class AcceptErrorFilter(logging.Filter):
    """asyncio reports every failed ``accept`` (EMFILE and friends) at ERROR with a traceback,
    once per retry; let one line without the traceback through per interval."""

    PREFIXES = (
        "socket.accept() out of system resource",
        "Error on transport creation for incoming connection",
    )

    def __init__(self) -> None:
        super().__init__()
        self._last_logged = float("-inf")
        self._suppressed = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if not isinstance(record.msg, str) or not record.msg.startswith(self.PREFIXES):
            return True
        now = time.monotonic()
        if now - self._last_logged < ACCEPT_ERROR_LOG_INTERVAL_SECONDS:
            self._suppressed += 1
            return False
        exc = record.exc_info[1] if record.exc_info else None
        first_line = record.msg.split("\n", 1)[0]
        record.msg = "%s: %s (%d more like it suppressed in the last %g s)"
        record.args = (first_line, exc, self._suppressed, ACCEPT_ERROR_LOG_INTERVAL_SECONDS)
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        record.exc_info, record.exc_text, record.stack_info = None, None, None
        self._last_logged, self._suppressed = now, 0
        return True


logging.getLogger("asyncio").addFilter(AcceptErrorFilter())
