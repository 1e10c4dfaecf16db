"""Probes and metrics: ``/up`` (liveness), ``/ready`` (readiness with reasons), ``/metrics``.

``/status`` is the JSON view ``kura status`` prints. ``/up`` is 200 whenever the process serves HTTP and never depends on peers. ``/ready`` is 200
only when ``readiness()`` reports no reasons, else 503 with the reasons, so an operator (or
kured's readiness gate) can read why. Neither needs credentials: they are the kubelet's probes.

``/status`` names peers' internal URLs, so with access control on it needs a read token like
the cache routes. ``/metrics`` needs one too when ``KURA_METRICS_REQUIRE_TOKEN`` is on (a
Prometheus scrape then sends ``authorization.credentials_file``, deploy/kura/servicemonitor.yaml).

The reasons (``kura.app``): draining; discovery has not yet heard from every seed (nor timed out)
or has not settled; a known peer is not yet bootstrapped (one whose passes failed too often stops
gating and is a warning instead, ``mesh.bootstrap``); writes are refused (a failed fsync, a
descriptor shortage, a full disk: docs/durability.md). A worker (``kura.workers``) forwards
``/ready`` to the primary, but answers 503 itself while it is short of descriptors
(``worker_ready``): its share of the public port serves nothing then. The same reasons and warnings are in
``/status``, ``kura status``, the status page (``/ui``) and the metrics.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from kura.api.auth import Access
from kura.api.grant_scope import request_namespace
from kura.api.http import ctx, endpoint
from kura.storage.fsync import process_shortage, shortage_reason

PROTOCOL = "probe"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
ReadinessSource = Callable[[], list[str]]
READINESS_KEY: web.AppKey[ReadinessSource] = web.AppKey("kura_readiness")
MEMBERS_KEY: web.AppKey[Callable[[], list[str]]] = web.AppKey("kura_members")
WARNINGS_KEY: web.AppKey[Callable[[], list[str]]] = web.AppKey("kura_warnings")
STATUS_KEY: web.AppKey[Callable[[], Awaitable[dict[str, Any]]]] = web.AppKey("kura_status")


@endpoint(PROTOCOL, None)
async def up(request: web.Request) -> web.StreamResponse:
    s = ctx(request).settings
    members = request.app[MEMBERS_KEY]()
    return web.json_response(
        {
            "status": "ok",
            "tenant_id": s.tenant_id,
            "region": s.region,
            "node": s.region,
            "members": members,
            "ring_members": len(members),
        }
    )


@endpoint(PROTOCOL, None)
async def ready(request: web.Request) -> web.StreamResponse:
    process_shortage.refresh()  # this moment's, not the last 100 ms's (storage.fsync)
    return _readiness(request.app[READINESS_KEY](), request.app[WARNINGS_KEY]())


def _readiness(reasons: list[str], warnings: list[str]) -> web.Response:
    body = {
        "status": "ok" if not reasons else "not_ready",
        "ready": not reasons,
        "reasons": reasons,
        # Problems that no longer block readiness but need an operator (an abandoned peer).
        "warnings": warnings,
    }
    return web.json_response(body, status=200 if not reasons else 503)


def worker_ready(forward: Handler) -> Handler:
    """A worker's ``/ready``: 503 with the reason while this process is short of descriptors
    (``storage.fsync.process_shortage``), else the primary's answer, ``forward``-ed (and
    counted there, not here)."""

    async def ready(request: web.Request) -> web.StreamResponse:
        if process_shortage.refresh() is None:
            return await forward(request)
        return await _short_here(request)

    return ready


@endpoint(PROTOCOL, None)
async def _short_here(_request: web.Request) -> web.StreamResponse:
    short = process_shortage()
    return _readiness([shortage_reason(short)] if short is not None else [], [])


@endpoint(PROTOCOL, Access.READ)
async def status(request: web.Request) -> web.StreamResponse:
    """The mesh as this node sees it: peers, health, outbox backlog, readiness."""
    return web.json_response(await request.app[STATUS_KEY]())


@endpoint(PROTOCOL, None)
async def metrics(request: web.Request) -> web.StreamResponse:
    c = ctx(request)
    if c.settings.metrics_require_token:
        c.auth.check(
            request.headers.get("Authorization"),
            Access.READ,
            lambda: request_namespace(request, PROTOCOL),
        )
    return web.Response(
        body=await c.metrics.node_exposition(),  # the workers' requests too (kura.workers)
        headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
    )


def routes() -> list[web.RouteDef]:
    return [
        web.get("/up", up),
        web.get("/ready", ready),
        web.get("/status", status),
        web.get("/metrics", metrics),
    ]
