"""Peer-only routes under ``/_internal/``, served on ``KURA_INTERNAL_PORT`` and never on the
public port (kura-behaviour.md §1.4). With mutual TLS configured, the listener refuses clients
without a certificate from the peers' CA before any route runs; with ``KURA_INTERNAL_TOKENS``,
every route first requires one of the peer tokens (``kura.api.peer_auth``: 401 otherwise).
A replica or tombstone whose version is more than ``KURA_MAX_CLOCK_SKEW_MS`` ahead of this
node's clock answers 400 (``FutureVersion``) with ``Kura-Refusal: future_version``: not applied
now, so the sender keeps it queued and retries it (``mesh.shipper.refusal_reason``).

Versions (the rules: ``kura.core.versions``; the headers: ``kura.mesh.wire``): every answer carries ``Kura-Wire-Version`` and ``Kura-Version``
(``version_headers``). Every route but ``/_internal/status`` first checks the request's
``Kura-Wire-Version`` (absent: wire 1, kura 0.1.0): one this node does not speak answers 503
with ``Kura-Refusal: wire_version`` and a message naming both versions (``wire_refusal``, run
before any handler and before ``100 Continue``: nothing is read or changed), logged at ERROR at
most once per ``LOG_INTERVAL_SECONDS`` (``kit.log_limit``: the line counts those left out); a
malformed one alike (``UNPARSEABLE_WIRE_VERSION``: a later release's format), never 400.

* ``GET /_internal/status`` → ``{"region", "tenant_id", "node_url", "wire_version",
  "kura_version"}`` (discovery probes; never refused for its version, so that the prober learns
  the versions and reports them).
* ``PUT /_internal/replicate/artifact`` — raw body, manifest in ``Kura-Manifest``, the sender's
  internal URL in ``Kura-Node`` (recorded as the copy's ``via``; optional). 204 whether
  applied or ignored (``Kura-Outcome`` says which); 400 bad manifest or body; 403 other tenant;
  413/503 budget. The body is not read when the copy would be ignored.
* ``DELETE /_internal/replicate/namespace?namespace_id=&version_ms=`` → 204.
* ``DELETE /_internal/replicate/writer?namespace_id=&writer=&version_ms=`` → 204: a peer's purge
  of one writer's entries of a namespace (``ArtifactWriter.purge_writer``); 400 for a missing
  or invalid writer or version.
* ``GET /_internal/bootstrap/manifests?after=&limit=`` and ``.../namespace_tombstones`` —
  cursor-paged in key order; ``next_after`` is null on the last page. Without ``after`` a page
  starts at the first key; with it (even ``after=``) strictly after it, because ``""`` is a real
  key: the tenant-wide namespace's tombstone.
* ``GET /_internal/bootstrap/manifests?order=newest&after=<version_ms>:<artifact_id>&limit=`` —
  the same manifests newest first, by (version_ms descending, artifact_id), with a compound
  cursor; the answer carries ``"order": "newest"`` (an older peer ignores ``order`` and answers
  without it, in key order). 400 for another ``order`` or a malformed cursor.
* ``GET /_internal/bootstrap/artifacts/{artifact_id}`` — raw bytes with ``Kura-Manifest``; 404
  when unknown or evicted. Paced by ``KURA_REPLICATION_BANDWIDTH_LIMIT_BYTES_PER_SECOND`` and
  the node's peer pace (``kura.mesh.peer_pace``), except with ``Kura-Read-Through: 1`` (a
  read-through fetch: a client waits on it).
* ``GET /_internal/changes?since=&limit=`` — the change feed, and ``POST /_internal/changes/pull``
  — a peer asks this node to pull its feed now (``kura.api.changes``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable

from aiohttp import web
from aiohttp.typedefs import Handler

from kit.log_limit import LogLimit
from kit.pace import seconds_ahead
from kura import __version__
from kura.api import changes
from kura.api.file_response import DamagedBlob, verified_chunks
from kura.api.http import artifact_response, ctx, declared_length, endpoint, request_body
from kura.api.query import query_int
from kura.core.errors import Forbidden, InvalidRequest
from kura.core.keys import HEX_SHA256, NAMESPACE, PRODUCERS, validate
from kura.core.manifest import writer_of
from kura.core.versions import (
    UNPARSEABLE_WIRE_VERSION,
    UNSPOKEN_WIRE_VERSION,
    WIRE_REFUSAL_STATUS,
    WIRE_VERSION,
    kura_version_of,
    speaks,
    unspoken_message,
    wire_version_of,
)
from kura.mesh.peer_pace import PeerPace
from kura.mesh.wire import (
    KURA_VERSION_HEADER,
    MANIFEST_HEADER,
    NODE_HEADER,
    ORDER_NEWEST,
    OUTCOME_HEADER,
    PAGE_LIMIT_DEFAULT,
    PAGE_LIMIT_MAX,
    READ_THROUGH_HEADER,
    REFUSAL_HEADER,
    TENANT_HEADER,
    VERSION_HEADERS,
    WIRE_VERSION_HEADER,
    decode_manifest,
    decode_version_cursor,
    encode_manifest,
    encode_version_cursor,
)
from kura.storage.artifact import StoredBody

log = logging.getLogger(__name__)

PROTOCOL = "internal"
NODE_URL_KEY: web.AppKey[Callable[[], str]] = web.AppKey("kura_node_url")
STATUS_PATH = "/_internal/status"
LOG_INTERVAL_SECONDS = 60.0


class WireVersions:
    """The internal listener's version check (``wire_refusal``, also the middleware) and the
    version headers on every answer (``stamp``, an ``on_response_prepare`` handler)."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        """``monotonic``: the clock (seconds) of the refusal log's limit, one line per
        ``LOG_INTERVAL_SECONDS`` across all senders (``kit.log_limit.LogLimit``)."""
        self._log_limit = LogLimit(1, LOG_INTERVAL_SECONDS, monotonic)

    def wire_refusal(self, request: web.Request) -> web.Response | None:
        """The answer refusing ``request`` for its ``Kura-Wire-Version``, or None when this
        node speaks it (absent: wire 1) or the route is ``/_internal/status``; else
        ``WIRE_REFUSAL_STATUS`` with ``Kura-Refusal: wire_version`` and a JSON ``{"message"}``
        naming both versions, for one outside this node's range and for a header that does not
        parse alike (``UNPARSEABLE_WIRE_VERSION``: a later release may change its format, and
        a 400 would make every sender, 0.1.0's too, drop the copy for good)."""
        if request.path == STATUS_PATH:
            return None
        try:
            theirs = wire_version_of(request.headers.get(WIRE_VERSION_HEADER))
        except ValueError:
            theirs = UNPARSEABLE_WIRE_VERSION
        if speaks(theirs):
            return None
        message = unspoken_message(
            theirs, kura_version_of(request.headers.get(KURA_VERSION_HEADER))
        )
        self._log(request.remote or "unknown", message)
        response = web.json_response(
            {"message": message, "wire_version": WIRE_VERSION, "kura_version": __version__},
            status=WIRE_REFUSAL_STATUS,
            headers={REFUSAL_HEADER: UNSPOKEN_WIRE_VERSION},
        )
        if request.body_exists:
            response.force_close()  # the unread body is never consumed
        return response

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        refused = self.wire_refusal(request)
        return await handler(request) if refused is None else refused

    async def stamp(self, request: web.Request, response: web.StreamResponse) -> None:
        """Every internal answer names this node's wire and kura versions."""
        response.headers.update(VERSION_HEADERS)

    def _log(self, remote: str, message: str) -> None:
        left_out = self._log_limit.admit()
        if left_out is None:
            return
        log.error(
            "refused a peer request from %s: %s (%d more refused since the last such line; "
            "at most one a minute)",
            remote,
            message,
            left_out,
        )


def _check_tenant(request: web.Request) -> None:
    tenant = request.headers.get(TENANT_HEADER)
    if tenant is not None and tenant != ctx(request).settings.tenant_id:
        raise Forbidden(f"peer of tenant {tenant!r} is not part of this mesh")


def _page_args(request: web.Request) -> tuple[str | None, int]:
    after = request.query.get("after")
    return after, query_int(
        request, "limit", default=PAGE_LIMIT_DEFAULT, low=1, high=PAGE_LIMIT_MAX
    )


@endpoint(PROTOCOL, None)
async def status(request: web.Request) -> web.StreamResponse:
    s = ctx(request).settings
    return web.json_response(
        {
            "region": s.region,
            "tenant_id": s.tenant_id,
            "node_url": request.app[NODE_URL_KEY](),
            "wire_version": WIRE_VERSION,
            "kura_version": __version__,
        }
    )


@endpoint(PROTOCOL, None, body_limit=lambda s: s.max_disk_bytes)
async def replicate_artifact(request: web.Request) -> web.StreamResponse:
    _check_tenant(request)
    try:
        manifest = decode_manifest(request.headers.get(MANIFEST_HEADER, ""))
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None
    if manifest.producer not in PRODUCERS:
        raise InvalidRequest(f"unknown producer {manifest.producer!r}")
    if manifest.version_ms <= 0 or manifest.size < 0:
        raise InvalidRequest("manifest version_ms must be > 0 and size >= 0")
    validate(manifest.artifact_id, HEX_SHA256, "artifact_id")
    validate(manifest.sha256, HEX_SHA256, "sha256")
    service = ctx(request).peer_pages()
    if service.artifact_id_of(manifest) != manifest.artifact_id:
        raise InvalidRequest("artifact_id does not match producer, namespace and key")
    try:  # who pushed it, for provenance only: visible ASCII, bounded, else not recorded
        via = writer_of(request.headers.get(NODE_HEADER, ""))
    except ValueError:
        via = ""
    outcome = await service.apply_replica(
        manifest,
        request_body(request, PROTOCOL),
        declared_length=declared_length(request),
        source="replication",
        via=via,
    )
    return web.Response(status=204, headers={OUTCOME_HEADER: outcome.value})


@endpoint(PROTOCOL, None)
async def replicate_namespace(request: web.Request) -> web.StreamResponse:
    _check_tenant(request)
    namespace = validate(request.query.get("namespace_id", ""), NAMESPACE, "namespace_id")
    version_ms = query_int(request, "version_ms", default=None, low=1, high=2**63 - 1)
    await ctx(request).peer_pages().delete_namespace(namespace, version_ms, source="replication")
    return web.Response(status=204)


@endpoint(PROTOCOL, None)
async def replicate_writer_purge(request: web.Request) -> web.StreamResponse:
    _check_tenant(request)
    namespace = validate(request.query.get("namespace_id", ""), NAMESPACE, "namespace_id")
    if "writer" not in request.query:
        raise InvalidRequest("writer is required")
    try:
        writer = writer_of(request.query["writer"])
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None
    version_ms = query_int(request, "version_ms", default=0, low=1, high=2**63 - 1)
    if not version_ms:
        raise InvalidRequest("version_ms is required")
    await (
        ctx(request).peer_pages().purge_writer(namespace, writer, version_ms, source="replication")
    )
    return web.Response(status=204)


@endpoint(PROTOCOL, None)
async def manifests(request: web.Request) -> web.StreamResponse:
    after, limit = _page_args(request)
    order = request.query.get("order", "artifact_id")
    if order == ORDER_NEWEST:
        return await _manifests_newest(request, after, limit)
    if order != "artifact_id":
        raise InvalidRequest(f"order must be artifact_id or {ORDER_NEWEST}, not {order!r}")
    page = await ctx(request).peer_pages().manifests_page(after, limit + 1)
    more = len(page) > limit
    page = page[:limit]
    return web.json_response(
        {
            "manifests": [m.to_json() for m in page],
            "next_after": page[-1].artifact_id if more else None,
        }
    )


async def _manifests_newest(
    request: web.Request, after: str | None, limit: int
) -> web.StreamResponse:
    try:
        cursor = None if after is None else decode_version_cursor(after)
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None
    page = await ctx(request).peer_pages().manifests_newest_page(cursor, limit + 1)
    more = len(page) > limit
    page = page[:limit]
    last = page[-1] if more else None
    return web.json_response(
        {
            "manifests": [m.to_json() for m in page],
            "order": ORDER_NEWEST,
            "next_after": None
            if last is None
            else encode_version_cursor(last.version_ms, last.artifact_id),
        }
    )


@endpoint(PROTOCOL, None)
async def tombstones(request: web.Request) -> web.StreamResponse:
    after, limit = _page_args(request)
    page = await ctx(request).peer_pages().tombstones_page(after, limit + 1)
    more = len(page) > limit
    page = page[:limit]
    return web.json_response(
        {
            "tombstones": [{"namespace_id": n, "version_ms": v} for n, v in page],
            "next_after": page[-1][0] if more else None,
        }
    )


@endpoint(PROTOCOL, None)
async def artifact(request: web.Request) -> web.StreamResponse:
    aid = validate(request.match_info["artifact_id"], HEX_SHA256, "artifact_id")
    c = ctx(request)
    body = await c.reader.read_by_id(aid)
    headers = {MANIFEST_HEADER: encode_manifest(body.manifest)}
    # A read-through fetch is not bootstrap traffic: a client of the asking node waits on it,
    # so neither the bootstrap limit nor the peer pace applies.
    read_through = bool(request.headers.get(READ_THROUGH_HEADER))
    rate = 0 if read_through else c.settings.replication_bandwidth_limit_bytes_per_second
    pace = None if request.method == "HEAD" else serving_pace(request)
    if pace is not None and not pace.slowing():
        try:
            await pace.acquire(body.manifest.size)  # paid up front; then sent at full speed
        except BaseException:
            body.close()
            raise
        pace = None
    if request.method == "HEAD" or (rate <= 0 and pace is None):
        return artifact_response(request, body, PROTOCOL, extra_headers=headers)
    return await _throttled(request, body, headers, rate, pace)


def serving_pace(request: web.Request) -> PeerPace | None:
    """The node's peer pace for a body served to a peer, or None: unpaced, or a read-through
    fetch (a client of the asking node waits on it: ``READ_THROUGH_HEADER``).

    The caller decides when the response starts: while public load slows peer traffic
    (``PeerPace.slowing``) the body is sent in paced chunks; otherwise it is paid for whole
    (``acquire(size)``, which waits only behind earlier paced bytes) and sent at full speed
    with ``sendfile``, the cheaper path."""
    pace = ctx(request).peer_pace
    if pace is None or request.headers.get(READ_THROUGH_HEADER):
        return None
    return pace


THROTTLE_CHUNK_BYTES = 64 * 1024


async def _throttled(
    request: web.Request,
    body: StoredBody,
    headers: dict[str, str],
    rate: int,
    pace: PeerPace | None,
) -> web.StreamResponse:
    """Send the body chunked at no more than ``rate`` bytes per second (0 = no per-transfer
    limit) and within ``pace`` (a peer bootstrapping from this node must not starve its
    clients: KURA_REPLICATION_BANDWIDTH_LIMIT_..., KURA_REPLICATION_PUBLIC_LATENCY_TARGET_MS)."""
    response = web.StreamResponse(status=200, headers=headers)
    response.content_type = body.manifest.content_type or "application/octet-stream"
    response.enable_chunked_encoding()
    c = ctx(request)
    try:
        await response.prepare(request)
        chunks = verified_chunks(c.reader, body, THROTTLE_CHUNK_BYTES)
        await paced_write(response, chunks, rate, pace)
        await response.write_eof()
    except DamagedBlob:
        # A chunked body cut short would look complete to a peer: reset the connection instead
        # (aiohttp then sees a client gone away when it finishes the response).
        if request.transport is not None:
            request.transport.abort()
    finally:
        body.close()
    return response


async def paced_write(
    response: web.StreamResponse,
    chunks: AsyncIterable[bytes] | Iterable[bytes],
    rate: int,
    pace: PeerPace | None = None,
) -> None:
    """Write ``chunks`` (cut to ``THROTTLE_CHUNK_BYTES``) at no more than ``rate`` bytes/s
    (0 = no fixed limit) and, with a ``pace``, within the node-wide peer pace."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    sent = 0

    async def pieces() -> AsyncIterator[bytes]:
        if isinstance(chunks, AsyncIterable):
            async for chunk in chunks:
                yield chunk
        else:
            for chunk in chunks:
                yield chunk

    async for chunk in pieces():
        for i in range(0, len(chunk), THROTTLE_CHUNK_BYTES):
            piece = chunk[i : i + THROTTLE_CHUNK_BYTES]
            await response.write(piece)
            sent += len(piece)
            if pace is not None:
                await pace.acquire(len(piece))
            ahead = seconds_ahead(sent, rate, loop.time() - started) if rate > 0 else 0.0
            if ahead > 0:
                await asyncio.sleep(ahead)


def routes() -> list[web.RouteDef]:
    return [
        web.get(STATUS_PATH, status),
        web.put("/_internal/replicate/artifact", replicate_artifact),
        web.delete("/_internal/replicate/namespace", replicate_namespace),
        web.delete("/_internal/replicate/writer", replicate_writer_purge),
        web.get("/_internal/bootstrap/manifests", manifests),
        web.get("/_internal/bootstrap/namespace_tombstones", tombstones),
        web.get("/_internal/bootstrap/artifacts/{artifact_id}", artifact, allow_head=True),
        *changes.routes(),
    ]
