"""HTTP client for talking to peers' internal listeners.

Every call has a timeout (``asyncio.timeout``) and turns aiohttp's errors into ``PeerError``, so
callers deal with one exception type. With mutual TLS configured, every connection presents this
node's certificate and verifies the peer's against the shared CA; with a peer token configured
(the first of ``KURA_INTERNAL_TOKENS``), every request carries it as a bearer token. Every
request carries this node's wire and kura versions (``kura.mesh.wire.version_headers``); a
peer that does not speak this node's wire version refuses with ``Kura-Refusal: wire_version``,
which ``PeerError.refusal`` carries with the peer's message naming both versions.

Metadata cost is counted here, per request kind (``METADATA_KINDS``, a closed set): how many
metadata requests this node made to its peers and the bytes of their response bodies, exported
as ``kura_peer_metadata_requests_total{kind}`` and ``kura_peer_metadata_bytes_total{kind}``
(issue 11: catch-up must cost what changed, and this is how it is measured).
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, BinaryIO

import aiohttp

from kura.core.manifest import Manifest
from kura.core.versions import UNPARSEABLE_WIRE_VERSION, kura_version_of, wire_version_of
from kura.mesh.peer_pace import PeerPace
from kura.mesh.wire import (
    MANIFEST_HEADER,
    NODE_HEADER,
    ORDER_NEWEST,
    OUTCOME_HEADER,
    READ_THROUGH_HEADER,
    REFUSAL_HEADER,
    TENANT_HEADER,
    decode_frames,
    decode_manifest,
    encode_manifest,
    version_headers,
)
from kura.storage.outbox import ChangesPage

log = logging.getLogger(__name__)

STREAM_CHUNK_BYTES = 256 * 1024
# Kinds of metadata request: the full bootstrap walk (manifest and tombstone pages) and the
# change feed. Closed set: the metrics' label values.
BOOTSTRAP = "bootstrap"
CHANGES = "changes"
METADATA_KINDS = (BOOTSTRAP, CHANGES)


class PeerError(Exception):
    """A peer could not be reached or answered with an error. ``status`` is None if unreached."""

    def __init__(self, message: str, status: int | None = None, refusal: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        # The peer's ``Kura-Refusal`` header on an error answer (e.g. ``future_version``).
        self.refusal = refusal


# How much of a peer's error body a PeerError quotes.
EXCERPT_CHARS = 400


def excerpt(body: str | bytes) -> str:
    """The first ``EXCERPT_CHARS`` of a peer's error body as a Python literal (``repr``):
    control characters, newlines and terminal escapes are escaped, never written as they are
    into logs, ``/ready`` and ``/status`` warnings and ``kura status`` output (a peer's body is
    not trusted). Bytes are decoded as UTF-8, undecodable ones replaced."""
    text = body.decode(errors="replace") if isinstance(body, bytes) else body
    return repr(text[:EXCERPT_CHARS])


@dataclass(frozen=True)
class PeerStatus:
    """A peer's ``/_internal/status``: who it is, and the wire and kura versions it runs (wire
    1 and no kura version for kura 0.1.0, whose answer names neither)."""

    node_url: str
    tenant_id: str
    region: str
    wire_version: int = 1
    kura_version: str | None = None


def client_ssl_context(ca: str, cert: str, key: str) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca)
    ctx.load_cert_chain(cert, key)
    return ctx


def server_ssl_context(ca: str, cert: str, key: str) -> ssl.SSLContext:
    """Server side of peer mTLS: a client without a certificate signed by ``ca`` is refused."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=ca)
    ctx.load_cert_chain(cert, key)
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


class PeerClient:
    """One shared connection pool to all peers. ``start()`` then ``close()``."""

    def __init__(
        self,
        tenant_id: str,
        ssl_context: ssl.SSLContext | None,
        request_timeout_seconds: float = 30.0,
        peer_token: str | None = None,
        pace: PeerPace | None = None,
        node_url: Callable[[], str] = lambda: "",
    ) -> None:
        self._tenant_id = tenant_id
        # This node's internal URL, named in each pushed copy (``Kura-Node``): the receiver
        # records which peer a copy came from (provenance's ``via``).
        self._node_url = node_url
        # Paces pushed and fetched bodies (not read-through fetches); None: unpaced.
        self.pace = pace
        self._peer_token = peer_token
        self._ssl = ssl_context
        self._timeout = request_timeout_seconds
        self._session: aiohttp.ClientSession | None = None
        # kind -> metadata requests made / response body bytes received (METADATA_KINDS).
        self.metadata_requests_total: dict[str, int] = dict.fromkeys(METADATA_KINDS, 0)
        self.metadata_bytes_total: dict[str, int] = dict.fromkeys(METADATA_KINDS, 0)

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=64, limit_per_host=16, ssl=self._ssl or False)
        headers = {TENANT_HEADER: self._tenant_id, **version_headers()}
        if self._peer_token:
            # Set once here, so every peer request carries it (KURA_INTERNAL_TOKENS).
            headers["Authorization"] = f"Bearer {self._peer_token}"
        self._session = aiohttp.ClientSession(connector=connector, headers=headers)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("PeerClient.start() has not been called")
        return self._session

    async def status(self, url: str, timeout_seconds: float = 2.0) -> PeerStatus:
        data = await self._get_json(url + "/_internal/status", timeout_seconds)
        try:
            try:
                wire = wire_version_of(
                    None if data.get("wire_version") is None else str(data["wire_version"])
                )
            except ValueError:  # a later format: a peer this node cannot talk to, not down
                wire = UNPARSEABLE_WIRE_VERSION
            return PeerStatus(
                str(data["node_url"]),
                str(data["tenant_id"]),
                str(data["region"]),
                wire,
                kura_version_of(data.get("kura_version")),
            )
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise PeerError(f"{url}: malformed status: {exc}") from exc

    async def push_artifact(self, url: str, manifest: Manifest, body: bytes | BinaryIO) -> str:
        """PUT one artifact; returns the receiver's outcome (applied, ignored_stale, ...)."""
        headers = {
            MANIFEST_HEADER: encode_manifest(manifest),
            "Content-Type": "application/octet-stream",
            "Content-Length": str(manifest.size),
        }
        if node_url := self._node_url():
            headers[NODE_HEADER] = node_url
        if self.pace is not None:
            await self.pace.acquire(manifest.size)
        try:
            async with asyncio.timeout(self._timeout + manifest.size / (16 * 1024 * 1024)):
                async with self.session.put(
                    url + "/_internal/replicate/artifact", data=body, headers=headers
                ) as resp:
                    text = await resp.text()
                    if resp.status // 100 != 2:
                        raise PeerError(
                            f"{url}: replicate answered {resp.status}: {excerpt(text)}",
                            resp.status,
                            resp.headers.get(REFUSAL_HEADER),
                        )
                    return resp.headers.get(OUTCOME_HEADER, "applied")
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise PeerError(f"{url}: replicate failed: {exc!r}") from exc

    async def push_tombstone(self, url: str, namespace_id: str, version_ms: int) -> None:
        params = {"namespace_id": namespace_id, "version_ms": str(version_ms)}
        await self._send("DELETE", url, "/_internal/replicate/namespace", "delete", params=params)

    async def push_purge(self, url: str, namespace_id: str, writer: str, version_ms: int) -> None:
        """Send a purge of ``writer``'s entries of ``namespace_id`` at ``version_ms`` (``DELETE
        /_internal/replicate/writer``). PeerError unless it answered 2xx."""
        params = {"namespace_id": namespace_id, "writer": writer, "version_ms": str(version_ms)}
        await self._send("DELETE", url, "/_internal/replicate/writer", "purge", params=params)

    async def ask_to_pull(self, url: str, node_url: str) -> None:
        """Tell the peer to pull this node's change feed now (``POST /_internal/changes/pull``
        naming this node in ``Kura-Node``; ``mesh.catch_up``). PeerError unless it answered
        2xx: 404 from an older kura, or from one that does not list this node as a peer."""
        headers = {NODE_HEADER: node_url}
        await self._send("POST", url, "/_internal/changes/pull", "pull request", headers=headers)

    async def _send(
        self,
        method: str,
        url: str,
        path: str,
        what: str,
        *,
        params: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        """A request without a body whose answer is only its status: PeerError unless 2xx."""
        try:
            async with asyncio.timeout(self._timeout):
                async with self.session.request(
                    method, url + path, params=params, headers=headers
                ) as resp:
                    text = await resp.text()
                    if resp.status // 100 != 2:
                        raise PeerError(
                            f"{url}: {what} answered {resp.status}: {excerpt(text)}",
                            resp.status,
                            resp.headers.get(REFUSAL_HEADER),
                        )
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise PeerError(f"{url}: {what} failed: {exc!r}") from exc

    async def manifests_page(
        self, url: str, after: str | None, limit: int, timeout_seconds: float = 30.0
    ) -> tuple[list[Manifest], str | None]:
        """One page strictly after the cursor ``after`` (None: the first page) and the next
        cursor (None after the last page)."""
        data = await self._get_json(
            url + "/_internal/bootstrap/manifests",
            timeout_seconds,
            _page_params(after, limit),
            kind=BOOTSTRAP,
        )
        return _page_of(url, data)

    async def manifests_newest_page(
        self, url: str, after: str | None, limit: int, timeout_seconds: float = 30.0
    ) -> tuple[list[Manifest], str | None, bool]:
        """One page of ``order=newest`` (version_ms descending, then artifact_id) strictly after
        the compound cursor ``after`` (None: the newest), the next cursor (None after the last
        page), and whether the peer honoured the order: a peer that predates it answers in
        artifact_id order with an artifact_id cursor, which this same call then pages on."""
        params = {**_page_params(after, limit), "order": ORDER_NEWEST}
        data = await self._get_json(
            url + "/_internal/bootstrap/manifests", timeout_seconds, params, kind=BOOTSTRAP
        )
        manifests, next_after = _page_of(url, data)
        return manifests, next_after, isinstance(data, dict) and data.get("order") == ORDER_NEWEST

    async def changes_page(
        self, url: str, since: int, limit: int, node_url: str, timeout_seconds: float = 30.0
    ) -> ChangesPage:
        """One page of the peer's change feed after ``since`` (``GET /_internal/changes``).
        ``node_url`` names this node to the peer (``Kura-Node``), which clears its catch-up mark
        for this node once this node has pulled to its head (``mesh.catch_up``)."""
        data = await self._get_json(
            url + "/_internal/changes",
            timeout_seconds,
            {"since": str(since), "limit": str(limit)},
            kind=CHANGES,
            headers={NODE_HEADER: node_url} if node_url else None,
        )
        try:
            return ChangesPage(
                epoch=str(data["epoch"]),
                head_seq=int(data["head_seq"]),
                tombstones=[
                    (str(t["namespace_id"]), int(t["version_ms"])) for t in data["tombstones"]
                ],
                manifests=_manifests_of(url, list(data["manifests"])),
                next_since=int(data["next_since"]),
                more=bool(data["more"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise PeerError(f"{url}: malformed changes page: {exc!r}") from exc

    async def tombstones_page(
        self, url: str, after: str | None, limit: int, timeout_seconds: float = 30.0
    ) -> tuple[list[tuple[str, int]], str | None]:
        """Like ``manifests_page``; the first page (``after`` None) includes namespace ``""``."""
        data = await self._get_json(
            url + "/_internal/bootstrap/namespace_tombstones",
            timeout_seconds,
            _page_params(after, limit),
            kind=BOOTSTRAP,
        )
        try:
            items = [(str(t["namespace_id"]), int(t["version_ms"])) for t in data["tombstones"]]
            return items, data.get("next_after")
        except (KeyError, TypeError, ValueError) as exc:
            raise PeerError(f"{url}: malformed tombstones page: {exc}") from exc

    async def fetch_artifact(
        self, url: str, artifact_id: str, timeout_seconds: float, *, read_through: bool = False
    ) -> FetchedArtifact | None:
        """Open a peer's artifact: its manifest and a body stream, or None if the peer lacks it.

        The caller must ``await fetched.close()``. ``timeout_seconds`` bounds the time to the
        response headers; reading the body is bounded by the caller. The body is paced by
        ``self.pace`` unless ``read_through`` (a client waits on it), which also asks the
        peer not to pace it (``READ_THROUGH_HEADER``).
        """
        headers = {READ_THROUGH_HEADER: "1"} if read_through else None
        path = f"/_internal/bootstrap/artifacts/{artifact_id}"
        try:
            async with asyncio.timeout(timeout_seconds):
                resp = await self.session.get(url + path, headers=headers)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise PeerError(f"{url}: fetch failed: {exc!r}") from exc
        if resp.status == 404:
            resp.release()
            return None
        if resp.status != 200:
            text = await resp.text()
            resp.release()
            raise PeerError(
                f"{url}: fetch answered {resp.status}: {excerpt(text)}",
                resp.status,
                resp.headers.get(REFUSAL_HEADER),
            )
        try:
            manifest = decode_manifest(resp.headers.get(MANIFEST_HEADER, ""))
        except ValueError as exc:
            resp.release()
            raise PeerError(f"{url}: {exc}") from exc
        pace = None if read_through else self.pace
        return FetchedArtifact(manifest, resp.content_length, resp, pace)

    async def fetch_small(
        self, url: str, artifact_ids: list[str], timeout_seconds: float
    ) -> list[tuple[str, Manifest | None, bytes | None, str]]:
        """Many small artifacts in one request (``POST /_internal/bootstrap/bodies``):
        ``(artifact_id, manifest, body, state)`` per frame (``kura.mesh.wire.decode_frames``).
        Raises ``PeerError`` on a transport failure, a non-200 or a malformed answer; an older
        peer without the route answers 404 or 405 (``PeerError.status``)."""
        try:
            async with asyncio.timeout(timeout_seconds):
                async with self.session.post(
                    url + "/_internal/bootstrap/bodies", json={"artifact_ids": artifact_ids}
                ) as resp:
                    payload = await resp.read()
                    if self.pace is not None:
                        await self.pace.acquire(len(payload))
                    if resp.status != 200:
                        raise PeerError(
                            f"{url}: bodies answered {resp.status}: {excerpt(payload)}",
                            resp.status,
                            resp.headers.get(REFUSAL_HEADER),
                        )
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise PeerError(f"{url}: bodies request failed: {exc!r}") from exc
        try:
            return decode_frames(payload)
        except ValueError as exc:
            raise PeerError(f"{url}: malformed bodies answer: {exc}") from exc

    async def _get_json(
        self,
        url: str,
        timeout_seconds: float,
        params: dict[str, str] | None = None,
        *,
        kind: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> Any:
        return (
            await self.get_json_counted(url, timeout_seconds, params, kind=kind, headers=headers)
        )[0]

    async def get_json_counted(
        self,
        url: str,
        timeout_seconds: float,
        params: dict[str, str] | None = None,
        *,
        kind: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[Any, int]:
        """GET a JSON document: (the decoded value, bytes of the response body). With ``kind``
        (one of METADATA_KINDS), count the request and its bytes. PeerError on anything but a
        200 with valid JSON (the status, if one came, in ``status``)."""
        try:
            async with asyncio.timeout(timeout_seconds):
                if kind is not None:
                    self.metadata_requests_total[kind] += 1
                async with self.session.get(url, params=params, headers=headers) as resp:
                    body = await resp.read()
                    if kind is not None:
                        self.metadata_bytes_total[kind] += len(body)
                    if resp.status != 200:
                        raise PeerError(
                            f"{url} answered {resp.status}: {excerpt(body)}",
                            resp.status,
                            resp.headers.get(REFUSAL_HEADER),
                        )
                    return json.loads(body), len(body)
        except (aiohttp.ClientError, TimeoutError, OSError, json.JSONDecodeError) as exc:
            raise PeerError(f"{url}: {exc!r}") from exc


def _page_of(url: str, data: Any) -> tuple[list[Manifest], str | None]:
    try:
        entries = list(data["manifests"])
        next_after = data.get("next_after")
    except (KeyError, TypeError, AttributeError) as exc:
        raise PeerError(f"{url}: malformed manifests page: {exc}") from exc
    return _manifests_of(url, entries), next_after


def _manifests_of(url: str, entries: list[Any]) -> list[Manifest]:
    manifests = []
    for entry in entries:
        # One bad manifest (a stored header with CR/LF, a mistyped field) is refused on its
        # own; it must not fail the page and with it every other artifact of the peer.
        try:
            if not isinstance(entry, dict):
                raise ValueError("not an object")
            manifests.append(Manifest.from_json(entry))
        except ValueError as exc:
            log.warning("refused a manifest from %s: %s", url, exc)
    return manifests


def _page_params(after: str | None, limit: int) -> dict[str, str]:
    """Query of a cursor page: no ``after`` at all for the first page (``after=`` is a cursor)."""
    params = {"limit": str(limit)}
    if after is not None:
        params["after"] = after
    return params


class FetchedArtifact:
    """A peer artifact being received: manifest, declared length and the body stream."""

    def __init__(
        self,
        manifest: Manifest,
        content_length: int | None,
        response: aiohttp.ClientResponse,
        pace: PeerPace | None = None,
    ) -> None:
        self.manifest = manifest
        self.content_length = content_length
        self._response = response
        self._pace = pace

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body (paced, if a pace was given); connection errors become ``PeerError``."""
        try:
            async for chunk in self._response.content.iter_chunked(STREAM_CHUNK_BYTES):
                yield chunk
                if self._pace is not None:
                    await self._pace.acquire(len(chunk))
        except (aiohttp.ClientError, OSError) as exc:
            raise PeerError(f"body stream broke: {exc!r}") from exc

    async def close(self) -> None:
        self._response.release()
