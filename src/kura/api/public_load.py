"""Measure public load for ``kura.mesh.peer_pace``: one middleware on the public listener only.

A public request counts as in flight from the middleware until its response body is sent (or
sending failed), so a large download keeps counting while it streams. Its latency sample is
taken when the handler has returned its response, before the body goes out (upstream Kura also
samples at time-to-first-byte, so large healthy downloads do not read as slow). A request with
a body over ``SAMPLE_MAX_BODY_BYTES`` (or a chunked one) gives no sample, for the same reason:
its handler waits on the client's upload. Probes (``/up``,
``/ready``, ``/status``, ``/metrics``), the status page and anything without an ``endpoint``
handler (404s, 405s) do not count; the internal listener has no such middleware, so peer traffic
never does. A worker process has the same middleware over a ``LoadTally`` that it reports to
the primary (``kura.mesh.load_report``); the gauges below are the node's, every process
included. Per request: two integer updates, one EWMA step and two bound methods, no lock.

The end of a body is seen by wrapping the response's ``prepare`` and ``write_eof``, which
aiohttp calls for every response after the handler returns (``finish_response``): ``write_eof``
ending (normally or not) or ``prepare`` raising (the client went away mid-body) ends the flight,
once.

Metrics (gauges, read at scrape time): ``kura_public_request_latency_ewma_seconds``,
``kura_public_requests_in_flight``, ``kura_replication_peer_slowdown_factor`` (the divisor of
the peer rate, 1 = not slowed) and ``kura_replication_peer_rate_bytes_per_second`` (0 =
unpaced); counters ``kura_replication_peer_paced_bytes_total`` and
``kura_replication_peer_pace_wait_seconds_total``.
"""

from __future__ import annotations

import math
import time
from typing import Protocol

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.typedefs import Middleware

from kura.api.http import Handler, endpoint_spec
from kura.api.metrics import Scraped, counter, gauge
from kura.mesh.peer_pace import PeerPace

# A request with a larger (or chunked) body gives no latency sample: its handler's time is
# mostly the client's upload speed. It still counts as in flight.
SAMPLE_MAX_BODY_BYTES = 64 * 1024
# Protocol of the routes that are not public load (``kura.api.probes``, also the status page).
NOT_LOAD = frozenset({"probe"})


class LoadSink(Protocol):
    """What the middleware feeds: ``PublicLoad`` in the primary, ``LoadTally`` in a worker."""

    def started(self) -> None: ...
    def sample(self, latency_seconds: float) -> None: ...
    def ended(self) -> None: ...


class _Flight:
    """One public request in flight (counted on creation); ``end()`` is idempotent.
    ``end_when_sent`` puts its ``prepare`` and ``write_eof`` in front of the response's."""

    __slots__ = ("_load", "_open", "_prepare", "_write_eof")

    def __init__(self, load: LoadSink) -> None:
        self._load = load
        self._open = True
        load.started()

    def end(self) -> None:
        if self._open:
            self._open = False
            self._load.ended()

    def end_when_sent(self, response: web.StreamResponse) -> None:
        self._prepare, self._write_eof = response.prepare, response.write_eof
        setattr(response, "prepare", self.prepare)  # noqa: B010 (an instance's method, on purpose)
        setattr(response, "write_eof", self.write_eof)  # noqa: B010

    async def prepare(self, request: web.BaseRequest) -> AbstractStreamWriter | None:
        try:
            return await self._prepare(request)
        except BaseException:
            self.end()
            raise

    async def write_eof(self, data: bytes = b"") -> None:
        try:
            await self._write_eof(data)
        finally:
            self.end()


def middleware(load: LoadSink) -> Middleware:
    """The aiohttp middleware that feeds ``load`` (for the public app only: the primary's, and
    each worker's, inside its forwarding, so a request it forwards counts in the primary)."""

    @web.middleware
    async def public_load(request: web.Request, handler: Handler) -> web.StreamResponse:
        spec = endpoint_spec(request.match_info.handler)
        if spec is None or spec.protocol in NOT_LOAD:
            return await handler(request)
        started = time.perf_counter()
        flight = _Flight(load)
        try:
            response = await handler(request)
        except BaseException:
            flight.end()  # an HTTP exception, cancelled or unhandled: no latency sample
            raise
        if not request.body_exists or (
            request.content_length is not None and request.content_length <= SAMPLE_MAX_BODY_BYTES
        ):
            load.sample(time.perf_counter() - started)
        flight.end_when_sent(response)
        return response

    return public_load


def collector(pace: PeerPace) -> Scraped:
    """The gauges and counters of ``pace`` and its ``PublicLoad``."""
    load = pace.load
    return Scraped(
        gauge(
            "kura_public_request_latency_ewma_seconds",
            "EWMA of public request latency (to the response being ready), decaying while idle.",
            load.latency_ewma_seconds,
        ),
        gauge(
            "kura_public_requests_in_flight",
            "Public requests (not probes) until their body is sent, on every process.",
            lambda: float(load.inflight_total()),
        ),
        gauge(
            "kura_replication_peer_slowdown_factor",
            "Peer body traffic runs at the shared rate divided by this (1 = not slowed).",
            lambda: load.factor() if pace.enabled else 1.0,
        ),
        gauge(
            "kura_replication_peer_rate_bytes_per_second",
            "Rate peer body traffic may use now (0 = unpaced).",
            lambda: 0.0 if math.isinf(rate := pace.rate()) else rate,
        ),
        counter(
            "kura_replication_peer_paced_bytes",
            "Peer body bytes that went through the pace (served, fetched, pushed).",
            lambda: float(pace.paced_bytes),
        ),
        counter(
            "kura_replication_peer_pace_wait_seconds",
            "Seconds peer transfers waited on the pace.",
            lambda: pace.waited_seconds,
        ),
    )
