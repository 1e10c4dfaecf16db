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
included. Per request: two integer updates, one EWMA step and a done callback, no lock.

The end of a body is seen as the end of the request's task: aiohttp runs each request in a task
of its own, which after the handler returns prepares the response and writes its end
(``finish_response``, ``web_protocol.RequestHandler._handle_request``) and only then ends,
whether the body went out or the client went away mid-body. A done callback on that task ends
the flight, once. (Until issue 30 the middleware wrapped each response's ``prepare`` and
``write_eof`` instead: two bound methods and two more coroutines per request.)

Metrics (gauges, read at scrape time): ``kura_public_request_latency_ewma_seconds``,
``kura_public_requests_in_flight``, ``kura_replication_peer_slowdown_factor`` (the divisor of
the peer rate, 1 = not slowed) and ``kura_replication_peer_rate_bytes_per_second`` (0 =
unpaced); counters ``kura_replication_peer_paced_bytes_total`` and
``kura_replication_peer_pace_wait_seconds_total``.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any, Protocol

from aiohttp import web
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


def middleware(load: LoadSink) -> Middleware:
    """The aiohttp middleware that feeds ``load`` (for the public app only: the primary's, and
    each worker's, inside its forwarding, so a request it forwards counts in the primary)."""

    def sent(_task: asyncio.Task[Any]) -> None:  # one function for every request's task
        load.ended()

    @web.middleware
    async def public_load(request: web.Request, handler: Handler) -> web.StreamResponse:
        spec = endpoint_spec(request.match_info.handler)
        if spec is None or spec.protocol in NOT_LOAD:
            return await handler(request)
        started = time.perf_counter()
        load.started()
        try:
            response = await handler(request)
        except BaseException:
            load.ended()  # an HTTP exception, cancelled or unhandled: no latency sample
            raise
        if not request.body_exists or (
            request.content_length is not None and request.content_length <= SAMPLE_MAX_BODY_BYTES
        ):
            load.sample(time.perf_counter() - started)
        task = asyncio.current_task()
        assert task is not None  # aiohttp runs each request in a task of its own
        task.add_done_callback(sent)  # the body sent, or sending failed (module docstring)
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
