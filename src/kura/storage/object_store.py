"""A thin async client for the shared object-storage tier (S3 and S3-compatible stores).

Built on obstore (Rust ``object_store`` behind a native asyncio API; GCS and Azure can follow
through the same library). Only what kura needs: put a staged file, stream an object into a
consumer, head, delete (one or many), and list a prefix with sizes and last-modified times (the
seam for bucket-side expiry).

Object layout (one object per artifact; a clean is one prefix list + delete): see
``kura.core.object_layout``. Each object is a self-describing body, the manifest first then
the artifact's bytes (``storage.object_header`` encodes and decodes it).

Every request is counted in ``ObjectStoreStats`` by operation and result, from closed sets
(``storage.object_store_stats``: ``OPS``, ``RESULTS``; ``classify`` maps an error to a result), with its latency; errors other
than "not found" raise ``ObjectStoreError`` (an ``Unavailable``: retry later) whose ``result``
says which. No secret is ever logged or put in a message.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, BinaryIO

import obstore
from obstore.store import S3Store

from kit.clock import Clock, SystemClock
from kura.core.errors import NotFound, Unavailable
from kura.core.manifest import Manifest
from kura.core.object_layout import namespace_prefix, object_key, parse_url
from kura.storage.breaker import Breaker
from kura.storage.object_header import decode_body, decode_header, encode_body
from kura.storage.object_store_stats import ObjectStoreStats, classify, first_line

log = logging.getLogger(__name__)

# What the circuit breaker's probe asks for (a HEAD; absent is an answer like any other).
PROBE_KEY = ".kura-start-check/probe"


class ObjectStoreError(Unavailable):
    """A request to the object store failed; ``result`` is one of ``RESULTS``."""

    def __init__(self, result: str, message: str) -> None:
        super().__init__(message, retry_after_seconds=5)
        self.result = result


class CircuitOpen(ObjectStoreError):
    """Not sent: the store failed too often just now (``storage.breaker``); ``result`` is
    ``"circuit_open"``, which is not a request result (nothing was sent)."""


class NotKuraObject(ObjectStoreError):
    """The object at a key is not in kura's format (no header, or one that does not parse)."""


@dataclass(frozen=True)
class ObjectStoreConfig:
    """Where the tier lives. ``url`` is ``s3://bucket/prefix``; the rest comes from the usual
    AWS variables (``from_env``). Secrets are excluded from ``repr``."""

    url: str
    bucket: str
    prefix: str
    endpoint: str | None = None
    region: str = "us-east-1"
    access_key_id: str | None = None
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    timeout_seconds: float = 30.0
    breaker_failures: int = 3
    breaker_cooldown_seconds: float = 10.0

    @classmethod
    def from_env(
        cls,
        url: str,
        environ: Mapping[str, str],
        timeout_seconds: float,
        breaker_failures: int = 3,
        breaker_cooldown_seconds: float = 10.0,
    ) -> ObjectStoreConfig:
        """Parse ``url`` (ValueError if it is not ``s3://bucket[/prefix]``) and read
        ``AWS_ENDPOINT_URL``, ``AWS_REGION`` (else ``AWS_DEFAULT_REGION``, else us-east-1),
        ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY`` and ``AWS_SESSION_TOKEN``."""
        bucket, prefix = parse_url(url)
        return cls(
            url=url,
            bucket=bucket,
            prefix=prefix,
            endpoint=environ.get("AWS_ENDPOINT_URL") or None,
            region=environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION") or "us-east-1",
            access_key_id=environ.get("AWS_ACCESS_KEY_ID") or None,
            secret_access_key=environ.get("AWS_SECRET_ACCESS_KEY") or None,
            session_token=environ.get("AWS_SESSION_TOKEN") or None,
            timeout_seconds=timeout_seconds,
            breaker_failures=breaker_failures,
            breaker_cooldown_seconds=breaker_cooldown_seconds,
        )


@dataclass(frozen=True)
class ListedObject:
    """One object under a listed prefix. ``key`` is relative to the configured prefix."""

    key: str
    size: int
    last_modified: datetime


class ObjectStore:
    """See module docstring. Safe to share between tasks on one event loop."""

    def __init__(
        self,
        config: ObjectStoreConfig,
        stats: ObjectStoreStats | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.config = config
        self.stats = stats or ObjectStoreStats()
        self.breaker = Breaker(
            clock or SystemClock(), config.breaker_failures, config.breaker_cooldown_seconds
        )
        kwargs: dict[str, Any] = {"region": config.region}
        if config.endpoint:
            kwargs["endpoint"] = config.endpoint
        if config.access_key_id:
            kwargs["access_key_id"] = config.access_key_id
        if config.secret_access_key:
            kwargs["secret_access_key"] = config.secret_access_key
        if config.session_token:
            kwargs["session_token"] = config.session_token
        timeout = timedelta(seconds=config.timeout_seconds)
        self._store = S3Store(
            config.bucket,
            prefix=config.prefix or None,
            client_options={
                "allow_http": bool(config.endpoint and config.endpoint.startswith("http://")),
                "timeout": timeout,
                "connect_timeout": timedelta(seconds=min(5.0, config.timeout_seconds)),
            },
            # One quick retry inside a request; the uploader's own backoff does the rest.
            retry_config={
                "max_retries": 1,
                "retry_timeout": timeout,
                "backoff": {"init_backoff": timedelta(milliseconds=200)},
            },
            **kwargs,
        )

    # -- layout ------------------------------------------------------------------------------

    @staticmethod
    def namespace_prefix(tenant_id: str, namespace_id: str) -> str:
        """The prefix (relative to the configured one) holding a namespace's objects."""
        return namespace_prefix(tenant_id, namespace_id)

    def key_of(self, manifest: Manifest, tenant_id: str) -> str:
        return object_key(tenant_id, manifest.namespace_id, manifest.artifact_id)

    def describe(self) -> str:
        """Where the tier is, for messages (never a secret)."""
        where = self.config.endpoint or "AWS"
        return f"{self.config.url} at {where}"

    # -- operations --------------------------------------------------------------------------

    async def put_file(self, key: str, manifest: Manifest, body: bytes | BinaryIO) -> None:
        """Upload ``manifest`` and the body (bytes, or an open file read from its start) as one
        object at ``key``. Raises ObjectStoreError; on success the whole object is stored
        (S3 PUT and multipart completion are atomic). Reads of the file run in a thread."""
        payload = await encode_body(manifest, body)
        await self._call(
            "put",
            lambda: obstore.put_async(
                self._store,
                key,
                payload,
                attributes={"Content-Type": "application/octet-stream"},
                use_multipart=not isinstance(payload, bytes),
            ),
        )
        self.stats.uploaded_bytes_total += manifest.size

    async def stored_version_ms(self, key: str) -> int | None:
        """The ``version_ms`` of the object at ``key`` (its header, read with a ranged GET), or
        None when absent, or 0 when it is not a kura object (no or a malformed header), so that
        any upload replaces it and any clean of its namespace deletes it, instead of a pass
        failing on it for ever. Raises ObjectStoreError when the store fails."""
        found = await self.stored_header(key)
        return None if found is None else found[0]

    async def stored_header(self, key: str) -> tuple[int, str | None] | None:
        """``(version_ms, writer)`` of the object at ``key``, as ``stored_version_ms`` reads it
        (``(0, None)`` for an object that is not kura's: no writer, not even ``""``, the
        anonymous one; None when absent)."""
        try:
            result = await self._call(
                "get",
                lambda: obstore.get_async(self._store, key, options={"range": (0, 64 * 1024)}),
            )
        except NotFound:
            return None
        chunks = _chunks(result.stream(min_chunk_size=64 * 1024), self)
        try:
            manifest, _rest = await decode_header(chunks)
        except ValueError:
            try:
                got = await self.get(key)  # a header above 64 KiB (stored headers): read it whole
            except NotKuraObject as exc:
                log.warning("%s; a write or clean replaces it", exc)
                return 0, None
            if got is None:
                return None
            manifest = got[0]
            await got[1].aclose()  # type: ignore[attr-defined]
        return manifest.version_ms, manifest.writer

    async def get(self, key: str) -> tuple[Manifest, AsyncIterator[bytes]] | None:
        """The stored manifest and an iterator over exactly the artifact's bytes, or None when
        there is no object at ``key``. Raises ObjectStoreError (also for an object that is not
        in kura's format). The iterator raises ObjectStoreError if the transfer breaks."""
        try:
            result = await self._call("get", lambda: obstore.get_async(self._store, key))
        except NotFound:
            return None
        stream = result.stream(min_chunk_size=256 * 1024)
        chunks = _chunks(stream, self)
        try:
            manifest, rest = await decode_body(chunks)
        except ValueError as exc:
            raise NotKuraObject("error", f"object {key} is not a kura object: {exc}") from None
        return manifest, rest

    async def head(self, key: str) -> int | None:
        """The stored object's size in bytes (header included), or None if absent."""
        try:
            meta = await self._call("head", lambda: obstore.head_async(self._store, key))
        except NotFound:
            return None
        return int(meta["size"])

    async def put_marker(self, key: str) -> None:
        """Write a zero-byte object at ``key`` (a touch marker: only its last-modified time
        matters). Raises ObjectStoreError."""
        await self._call("put", lambda: obstore.put_async(self._store, key, b""))

    async def modified_ms(self, key: str) -> int | None:
        """The object's last-modified time in wall-clock ms (the store's clock), or None if
        absent. Raises ObjectStoreError."""
        try:
            meta = await self._call("head", lambda: obstore.head_async(self._store, key))
        except NotFound:
            return None
        return int(meta["last_modified"].timestamp() * 1000)

    async def delete_many(self, keys: Sequence[str]) -> None:
        """Delete ``keys`` (absent ones are fine). Raises ObjectStoreError."""
        for start in range(0, len(keys), 1000):  # S3 DeleteObjects takes at most 1,000 keys
            page = list(keys[start : start + 1000])
            await self._call("delete", functools.partial(obstore.delete_async, self._store, page))

    async def list_prefix(self, prefix: str) -> AsyncIterator[list[ListedObject]]:
        """Pages of the objects under ``prefix`` (relative to the configured prefix), with
        sizes and last-modified times. Raises ObjectStoreError."""
        stream = obstore.list(self._store, prefix, chunk_size=1000)
        while True:
            page = await self._call("list", lambda: _next_page(stream))
            if page is None:
                return
            yield [ListedObject(str(m["path"]), int(m["size"]), m["last_modified"]) for m in page]

    async def delete_prefix(self, prefix: str) -> int:
        """Delete every object under ``prefix``; the number deleted. Raises ObjectStoreError."""
        deleted = 0
        async for page in self.list_prefix(prefix):
            await self.delete_many([o.key for o in page])
            deleted += len(page)
        return deleted

    async def check(self) -> ObjectStoreError | None:
        """At start: list the prefix and write, read and delete one probe object. None when
        all worked, else the first failure (its ``result`` is a ``RESULTS`` value, its message
        the store's own words, e.g. a refused credentials lookup)."""
        probe = f".kura-start-check/{time.time_ns()}"
        try:
            async for _page in self.list_prefix(".kura-start-check/"):
                break
            header = Manifest("probe", "probe", "", "probe", "text/plain", 0, "", 0, 0)
            await self.put_file(probe, header, b"")
            await self.delete_many([probe])
        except ObjectStoreError as exc:
            return exc
        return None

    async def probe(self) -> bool:
        """When the circuit breaker is open and its cool-down over: one HEAD of a key that
        need not exist, whose answer closes the breaker (``storage.breaker``). True when the
        store answered; False when it failed (logged: one line per cool-down) or no probe
        was due."""
        if not self.breaker.probe_due():
            return False
        try:
            await self._call("head", lambda: obstore.head_async(self._store, PROBE_KEY), probe=True)
        except NotFound:
            return True
        except ObjectStoreError as exc:
            log.warning(
                "%s; requests keep skipping the store for %gs",
                exc.message,
                self.breaker.cooldown_seconds,
            )
            return False
        return True

    async def _call(
        self, op: str, request: Callable[[], Awaitable[Any]], *, probe: bool = False
    ) -> Any:
        """Send ``request()`` (called only if the breaker lets it through: an obstore call
        starts its request as soon as it is made) and count it. Raises CircuitOpen without
        sending anything while the breaker is open (``storage.breaker``); ``probe``: this is
        the breaker's probe."""
        entered = self.breaker.enter(probe)
        if entered is None:
            state = self.breaker.state
            raise CircuitOpen(
                "circuit_open",
                f"object store {op} skipped: the store failed {state.consecutive_failures} "
                f"times in a row ({state.last_failure}); it is probed again every "
                f"{self.breaker.cooldown_seconds:g}s",
            )
        started = time.monotonic()
        try:
            value = await request()
            self._observe(op, "ok", started)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise self._failed(op, exc, started) from None
        finally:
            if entered:
                self.breaker.probe_ended()
        return value

    def _observe(self, op: str, result: str, started: float) -> None:
        self.stats.observe(op, result, time.monotonic() - started)
        was_open = self.breaker.state.open
        self.breaker.record(result)
        state = self.breaker.state
        if state.open and not was_open:
            log.warning(
                "object store %s unreachable: %d failures in a row (last: %s); requests skip "
                "it for %gs, then one probes it (a local miss answers at once meanwhile)",
                self.describe(),
                state.consecutive_failures,
                result,
                self.breaker.cooldown_seconds,
            )
        elif was_open and not state.open:
            log.info("object store %s answers again; requests go to it", self.describe())

    def _failed(self, op: str, exc: BaseException, started: float) -> Exception:
        result = classify(exc)
        self._observe(op, result, started)
        if result == "not_found":
            return NotFound("object not found")
        return ObjectStoreError(result, f"object store {op} failed ({result}): {first_line(exc)}")


async def _next_page(stream: Any) -> Any:
    """The next page of an obstore list stream, None at its end."""
    try:
        return await stream.__anext__()
    except StopAsyncIteration:
        return None


async def _chunks(stream: Any, store: ObjectStore) -> AsyncIterator[bytes]:
    started = time.monotonic()
    try:
        async for chunk in stream:
            yield bytes(chunk)
    except Exception as exc:
        raise store._failed("get", exc, started) from None
