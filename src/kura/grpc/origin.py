"""Downloads from origin for the Remote Asset ``FetchBlob`` (``kura.grpc.asset``) on a miss.

Off unless ``KURA_ASSET_FETCH_ALLOWED_HOSTS`` names origins (``kura.core.asset.AllowedHosts``).
A server that fetches URLs for its clients is a server-side request forgery risk (OWASP
SSRF Prevention Cheat Sheet), so every hop of a download is checked the same way:

* the URI must be ``http``/``https`` with a host the allow-list matches (else
  PERMISSION_DENIED);
* the host is resolved once, here; every address must be global (``is_public``: not
  private, loopback, link-local, shared, reserved, multicast or unspecified; an IPv6 address
  that carries an IPv4 one, mapped, NAT64, 6to4 or Teredo, is judged by that IPv4 address
  too) unless the allow-list names the host without a wildcard and with the port
  (``AllowedHosts.match``; else PERMISSION_DENIED), and the connection goes to those checked addresses only
  (``check_addresses``, then ``_Pinned``: aiohttp asks it instead of DNS, so no second look-up can answer differently);
* redirects are not followed by aiohttp: each ``Location`` (at most ``MAX_REDIRECTS``) is a new
  hop, checked as above;
* the request asks for ``Accept-Encoding: identity`` and nothing is decompressed: the blob is
  the file itself (a gzip bomb is never inflated, and a server that compresses text for
  clients that accept it does not get its encoding stored as the file).

The body is streamed into the CAS through ``ArtifactWriter.put_stream``, the write path every
upload takes: the declared ``Content-Length`` (or, without one, what arrives) is reserved from
the tmp budget, the route's limit (``KURA_MAX_ARTIFACT_BYTES``) applies, and a ``checksum.sri``
is checked on the bytes before the commit. On any failure nothing is left behind (no blob, no
staged file, no reserved byte). Failures are ``OriginFailed`` with the status the response
carries inline (remote_asset.proto, ``FetchBlobResponse.status``): PERMISSION_DENIED (origin not
allowed), NOT_FOUND (404/410, or not an http(s) URL), ABORTED (checksum mismatch),
RESOURCE_EXHAUSTED (too large, no room), DEADLINE_EXCEEDED (``timeout``), UNAVAILABLE (the
origin unreachable or answering an error, or its body stalled or slower than
``KURA_MIN_UPLOAD_BYTES_PER_SECOND``: the rule every upload's body is held to,
``kura.api.upload_rate``). At most ``KURA_ASSET_FETCH_MAX_DOWNLOADS``
calls download at once on a node (``OriginDownloads.first``): each may hold an origin
connection, a tmp reservation and a staged file until its deadline. Each download is counted in
``kura_asset_origin_downloads_total{result}`` (``stored``, ``refused``, ``failed``).
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import logging
import socket
from collections.abc import AsyncIterator, Sequence
from typing import Any
from urllib.parse import urljoin

import aiohttp
import grpc
from aiohttp.abc import AbstractResolver, ResolveResult
from prometheus_client import Counter

from kura.api.action_lookup import cas_ref
from kura.api.upload_rate import UploadRule
from kura.core import errors as e
from kura.core.asset import (
    AllowedHosts,
    Digest,
    Origin,
    Sri,
    credentials_in,
    origin_of,
    stored_uri,
)
from kura.grpc.common import GrpcContext

log = logging.getLogger(__name__)

MAX_REDIRECTS = 5
CHUNK_BYTES = 256 * 1024
REDIRECTS = frozenset({301, 302, 303, 307, 308})
ENV_NAME = "KURA_ASSET_FETCH_ALLOWED_HOSTS"
# How long a call waits for a download slot (KURA_ASSET_FETCH_MAX_DOWNLOADS) before it is
# refused: long enough for a burst of repository fetches (Bazel fetches several at once) to
# queue behind one another, short enough that a waiting call holds its connection briefly.
SLOT_WAIT_SECONDS = 10.0
IDENTITY = {"Accept-Encoding": "identity"}  # the origin's file as it is, not an encoding of it


class OriginFailed(Exception):
    """A download that failed: ``code`` and ``message`` go in the response's inline status."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.uri = ""  # the URI it concerns (``OriginDownloads.first``)


class ChecksumMismatch(e.InvalidRequest):
    """The downloaded bytes do not match the request's ``checksum.sri``."""


class OriginDownloads:
    """Downloads into the CAS (module docstring). Safe to use from many calls at once."""

    def __init__(self, gc: GrpcContext) -> None:
        self.gc = gc
        self.allowed = AllowedHosts.parse(gc.settings.asset_fetch_allowed_hosts)
        self.downloads = Counter(
            "kura_asset_origin_downloads_total",
            "Remote Asset FetchBlob downloads from origin, by result (stored, refused: origin "
            "not allowed or a non-global address, failed: anything else).",
            ["result"],
            registry=gc.metrics.registry,
        )
        for result in ("stored", "refused", "failed"):
            self.downloads.labels(result)
        for entry, instead in portless_local(self.allowed):
            log.warning(
                "%s entry %r has no port, so it allows global addresses only and can never "
                "reach %s (not a global address): write %s for each port to allow",
                ENV_NAME,
                entry,
                entry,
                instead,
            )
        self.limit = gc.settings.asset_fetch_max_downloads
        self.slots = asyncio.Semaphore(self.limit)

    async def first(
        self, ns: str, uris: Sequence[str], sri: Sri | None, seconds: float, *, writer: str
    ) -> tuple[str, Digest]:
        """The first of ``uris`` (in order) downloaded into ``ns``'s CAS, stored as written by
        ``writer`` (``kura.core.provenance``: the caller), and its digest, all
        within ``seconds`` (one deadline for the call, however many URIs). The call first takes
        one of the node's ``KURA_ASSET_FETCH_MAX_DOWNLOADS`` slots, waiting at most
        ``SLOT_WAIT_SECONDS`` (and its deadline) for one: ``ResourceExhausted`` past that, with
        nothing asked of any origin. ``OriginFailed`` (with ``uri``) is the last URI's failure,
        or the deadline's."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        try:
            async with asyncio.timeout(min(seconds, SLOT_WAIT_SECONDS)):
                await self.slots.acquire()
        except TimeoutError:
            raise e.ResourceExhausted(
                f"{self.limit} downloads from origin are under way on this node "
                f"(KURA_ASSET_FETCH_MAX_DOWNLOADS) and none ended in time: retry later"
            ) from None
        try:
            failed = OriginFailed(grpc.StatusCode.NOT_FOUND, "no URI")
            for uri in uris:
                try:
                    return uri, await self.download(ns, uri, sri, deadline, seconds, writer)
                except OriginFailed as exc:
                    failed, failed.uri = exc, uri
                    if exc.code is grpc.StatusCode.DEADLINE_EXCEEDED:
                        break  # the call's time is spent: the other URIs are not tried
            raise failed
        finally:
            self.slots.release()

    async def download(
        self, ns: str, uri: str, sri: Sri | None, deadline: float, seconds: float, writer: str
    ) -> Digest:
        """Download ``uri`` into namespace ``ns``'s CAS by ``deadline`` (event-loop time, the
        end of the call's ``seconds``); its (sha256 hex, size). Raises ``OriginFailed`` (module
        docstring), leaving nothing stored."""
        if origin_of(uri) is None:  # a URN or the like: nothing to download, not counted
            raise OriginFailed(
                grpc.StatusCode.NOT_FOUND, f"{uri[:200]} is not an http(s) URL to download"
            )
        try:
            async with asyncio.timeout_at(deadline):
                digest = await self._follow(ns, uri, sri, writer)
        except TimeoutError:
            self.downloads.labels("failed").inc()
            raise OriginFailed(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"the call's downloads took longer than {seconds:g} s",
            ) from None
        except (aiohttp.ClientError, OSError) as exc:
            self.downloads.labels("failed").inc()
            raise OriginFailed(
                grpc.StatusCode.UNAVAILABLE, f"the origin could not be reached: {exc}"
            ) from None
        except OriginFailed as exc:
            refused = exc.code is grpc.StatusCode.PERMISSION_DENIED
            self.downloads.labels("refused" if refused else "failed").inc()
            raise
        self.downloads.labels("stored").inc()
        return digest

    async def _follow(self, ns: str, uri: str, sri: Sri | None, writer: str) -> Digest:
        for _hop in range(MAX_REDIRECTS + 1):
            origin = origin_of(uri)
            if origin is None:
                raise OriginFailed(
                    grpc.StatusCode.NOT_FOUND, f"{uri[:200]} is not an http(s) URL to download"
                )
            if credentials_in(uri):  # a redirect's: the request's were refused before
                raise OriginFailed(
                    grpc.StatusCode.UNAVAILABLE,
                    f"the origin redirected to {stored_uri(uri)[:200]}, a URI with credentials "
                    "(user:password@): not followed",
                )
            explicit = self.allowed.match(origin)
            if explicit is None:
                raise OriginFailed(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"origin {origin.host}:{origin.port} is not allowed ({ENV_NAME})",
                )
            addresses = await check_addresses(origin, explicit)
            connector = aiohttp.TCPConnector(
                resolver=_Pinned(origin.host, addresses), use_dns_cache=False, limit=1
            )
            idle = float(self.gc.settings.body_idle_timeout_seconds)
            async with (
                aiohttp.ClientSession(
                    connector=connector,
                    auto_decompress=False,  # the origin's bytes, as a client would get them
                    trust_env=False,  # no proxy from the environment
                    timeout=aiohttp.ClientTimeout(total=None, sock_connect=idle, sock_read=idle),
                ) as session,
                # aiohttp asks for gzip and deflate unless told: a web server would then
                # compress text, and the encoded bytes would be stored as the file.
                session.get(uri, allow_redirects=False, headers=IDENTITY) as response,
            ):
                if response.status in REDIRECTS and "Location" in response.headers:
                    uri = urljoin(uri, response.headers["Location"])
                    continue
                if response.status in (404, 410):
                    raise OriginFailed(
                        grpc.StatusCode.NOT_FOUND, f"the origin answered {response.status}"
                    )
                if response.status != 200:
                    raise OriginFailed(
                        grpc.StatusCode.UNAVAILABLE, f"the origin answered {response.status}"
                    )
                return await self._store(ns, response, sri, writer)
        raise OriginFailed(
            grpc.StatusCode.UNAVAILABLE, f"more than {MAX_REDIRECTS} redirects from the origin"
        )

    async def _store(
        self, ns: str, response: aiohttp.ClientResponse, sri: Sri | None, writer: str
    ) -> Digest:
        body = _checked(self._paced(response.content), sri)
        try:
            result = await self.gc.writer.put_stream(
                lambda sha256: cas_ref(ns, sha256, writer),
                body,
                declared_length=response.content_length,
                limit_bytes=self.gc.settings.max_artifact_bytes,
                content_type="application/octet-stream",
            )
        except ChecksumMismatch as exc:
            raise OriginFailed(grpc.StatusCode.ABORTED, exc.message) from None
        except (e.PayloadTooLarge, e.ResourceExhausted, e.InsufficientStorage) as exc:
            raise OriginFailed(grpc.StatusCode.RESOURCE_EXHAUSTED, exc.message) from None
        except e.KuraError as exc:
            raise OriginFailed(
                grpc.StatusCode.UNAVAILABLE, f"the download was not stored: {exc.message}"
            ) from None
        except aiohttp.ClientError as exc:
            raise OriginFailed(
                grpc.StatusCode.UNAVAILABLE, f"the origin's body broke off: {exc}"
            ) from None
        self.gc.metrics.bytes_in_child("grpc").inc(result.manifest.size)
        return result.manifest.sha256, result.manifest.size

    async def _paced(self, content: aiohttp.StreamReader) -> AsyncIterator[bytes]:
        """The origin's body in chunks of at most ``CHUNK_BYTES``, held to the listeners' one
        rule for a body that holds a tmp reservation (``kura.api.upload_rate``: stalled for
        ``KURA_BODY_IDLE_TIMEOUT_SECONDS``, or averaging below
        ``KURA_MIN_UPLOAD_BYTES_PER_SECOND`` past the grace period): ``OriginFailed``
        (UNAVAILABLE) then, so a slow origin cannot hold its reservation until the call's
        deadline."""
        loop = asyncio.get_running_loop()
        meter = UploadRule.of(self.gc.settings).meter(loop.time())
        while True:
            try:
                async with asyncio.timeout(meter.seconds_left(loop.time())):
                    chunk = await content.read(CHUNK_BYTES)
            except TimeoutError:
                verdict = meter.due(loop.time())
            else:
                if not chunk:
                    return
                meter.add(len(chunk), loop.time())
                if (verdict_now := meter.verdict(loop.time())) is None:
                    yield chunk
                    continue
                verdict = verdict_now
            message = meter.give_up(self.gc.metrics, "asset origin", verdict, loop.time())
            raise OriginFailed(grpc.StatusCode.UNAVAILABLE, f"the origin's body: {message}")


async def _checked(chunks: AsyncIterator[bytes], sri: Sri | None) -> AsyncIterator[bytes]:
    """``chunks``; at their end ``ChecksumMismatch`` unless they match ``sri`` (raised inside
    the write, before its commit, so nothing is stored)."""
    h = None if sri is None else hashlib.new(sri.algorithm)
    async for chunk in chunks:
        if h is not None:
            h.update(chunk)
        yield chunk
    if sri is not None and h is not None and not sri.matches(h.digest()):
        raise ChecksumMismatch(
            f"the downloaded bytes do not match checksum.sri ({sri.algorithm}): nothing stored"
        )


def portless_local(allowed: AllowedHosts) -> list[tuple[str, str]]:
    """The entries of ``allowed`` that can never be reached: ``localhost`` (and
    ``*.localhost``, RFC 6761 §6.3) or a non-global IP literal named without a port, which
    allows global addresses only (``AllowedHosts.match``); each as written and what to write
    instead (``host:PORT``). Logged at start-up: such an entry is accepted but useless."""
    found = []
    for host, port in allowed.entries:
        if port is not None:
            continue
        try:
            local = not is_public(ipaddress.ip_address(host))
        except ValueError:
            local = host == "localhost" or host.endswith(".localhost")
        if local:
            written = f"[{host}]" if ":" in host else host
            found.append((written, f"{written}:PORT"))
    return found


async def check_addresses(origin: Origin, explicit: bool) -> list[ResolveResult]:
    """The addresses ``origin.host`` resolves to (one look-up; an IP literal needs none), as
    aiohttp's resolver answers them, each with ``origin.port``. ``OriginFailed``:
    PERMISSION_DENIED when one is not global and the host was not allowed ``explicit``-ly,
    UNAVAILABLE when it does not resolve."""
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(origin.host, origin.port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise OriginFailed(
            grpc.StatusCode.UNAVAILABLE, f"origin {origin.host} does not resolve: {exc}"
        ) from None
    results: list[ResolveResult] = []
    for family, _type, proto, _name, sockaddr in infos:
        text = str(sockaddr[0])
        address = ipaddress.ip_address(text.split("%", 1)[0])
        if not explicit and not is_public(address):
            raise OriginFailed(
                grpc.StatusCode.PERMISSION_DENIED,
                f"origin {origin.host} resolves to {address}, not a global address (private, "
                f"loopback, link-local or reserved): only a host {ENV_NAME} names with its "
                "port and without '*' may (host:port)",
            )
        results.append(
            ResolveResult(
                hostname=origin.host,
                host=text,
                port=origin.port,
                family=family,
                proto=proto,
                flags=socket.AI_NUMERICHOST,
            )
        )
    if not results:
        raise OriginFailed(grpc.StatusCode.UNAVAILABLE, f"origin {origin.host} has no address")
    return results


# IPv6 prefixes whose last 32 bits are an IPv4 address: NAT64 (RFC 6052, RFC 8215),
# IPv4-compatible (RFC 4291, deprecated) and IPv4-translated (RFC 2765).
CARRY_IPV4 = tuple(
    ipaddress.ip_network(n) for n in ("64:ff9b::/96", "64:ff9b:1::/48", "::/96", "::ffff:0:0:0/96")
)


def is_public(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Whether ``address`` and every IPv4 address it carries are global unicast. An IPv6
    address may reach an IPv4 one: mapped (``::ffff:a.b.c.d``), IPv4-compatible
    (``::a.b.c.d``), IPv4-translated (``::ffff:0:a.b.c.d``), NAT64 (``64:ff9b::a.b.c.d``, which a NAT64 gateway forwards to the
    private network behind it, and which ``ipaddress`` counts as global), 6to4 and Teredo;
    each is judged by the IPv4 address too. Multicast is never an origin (``ipaddress`` of
    Python 3.11 counts 224.0.0.0/4 global)."""
    if not address.is_global or address.is_multicast:
        return False
    if isinstance(address, ipaddress.IPv4Address):
        return True
    carried = [address.ipv4_mapped, address.sixtofour, *(address.teredo or ())]
    if any(address in n for n in CARRY_IPV4):
        carried.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    return all(is_public(v4) for v4 in carried if v4 is not None)


class _Pinned(AbstractResolver):
    """aiohttp's resolver for one download: the addresses ``check_addresses`` checked, for that host
    only (any other host is an error, never a DNS look-up)."""

    def __init__(self, host: str, addresses: list[ResolveResult]) -> None:
        self.host = host
        self.addresses = addresses

    async def resolve(
        self, host: str, port: int = 0, family: Any = socket.AF_INET
    ) -> list[ResolveResult]:
        if host.lower().rstrip(".") != self.host:
            raise OSError(f"{host} was not checked for this download")
        return self.addresses

    async def close(self) -> None:
        return None
