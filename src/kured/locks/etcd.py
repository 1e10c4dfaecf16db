"""The reboot lock in etcd v3, through etcd's JSON gateway, with kured's record format.

Two pieces:

* ``EtcdKV`` — a small etcd v3 client over the gRPC JSON gateway (``POST /v3/kv/range`` and
  ``/v3/kv/txn``; keys and values base64, int64 fields as decimal strings): read a key with its
  ``mod_revision``, and compare-and-swap put/delete on that revision (0 = "the key must be
  absent": etcd reports revision 0 for a missing key). A lost compare returns the key's current
  value from the same transaction's failure branch, so a retry needs no extra read. Shared by
  ``EtcdLock`` and the FleetLock server.
* ``EtcdLock`` — the ``Lock`` protocol on one key. The value is exactly what kured stores in
  its lock annotation (``kured.core.lockrecord``): the single format when ``max_holders`` is 1,
  the multi format ``{"maxOwners":N,"locks":[…]}`` otherwise. Every change is read → pure
  transition → CAS write on the ``mod_revision`` read. Mutual exclusion rests on etcd's
  compare alone, never on timing. A lost compare is retried at once on the value the failed transaction
  returned (the freshest there is); every ``IMMEDIATE_RETRIES``-th consecutive loss backs off
  with full jitter and re-reads; after ``max_attempts`` losses ``LockConflict`` is raised.

Gateway path: etcd 3.4 (Debian's ``etcd-server``) serves both ``/v3/`` and ``/v3beta/``; 3.5+
only ``/v3/``; 3.3 only ``/v3beta/``. We use ``/v3`` and fall back to ``/v3beta`` for an
endpoint that answers 404, remembering the choice per endpoint.

Failure rules: every HTTP exchange runs under ``asyncio.timeout(request_timeout_seconds)``. A
connection error, a timeout or a 5xx moves to the next endpoint in the list (failover); when
every endpoint failed, ``LockError`` is raised from the last error. A 4xx other than the path
probe is a ``LockError`` at once (our request was wrong; another endpoint would say the same).
Retrying a CAS on another endpoint after an ambiguous failure is safe: if the first write did
land, the retry's compare fails and the transition, re-run on the current value, sees the change
already made (an acquire finds itself holding; a release finds nothing to remove).

Instances are safe to use from many tasks of one event loop at once; ``close()`` ends the HTTP
session (the instance must not be used afterwards).
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from kit.backoff import Backoff
from kit.clock import Clock
from kured.core import lockrecord
from kured.core.errors import LockConflict, LockError
from kured.core.lockrecord import LockRecord, Outcome, Transition, Write
from kured.locks.record import RecordLock

API_PREFIXES = ("/v3", "/v3beta")
DEFAULT_REQUEST_TIMEOUT_SECONDS = 5.0
# etcd answers small JSON documents; anything bigger is not the gateway we expect.
MAX_RESPONSE_BYTES = 4 * 1024 * 1024
DEFAULT_MAX_ATTEMPTS = 16
# Lost compares retried at once on the value the failed txn returned, before backing off.
IMMEDIATE_RETRIES = 4
# Lost-compare backoff: full jitter over an exponentially growing cap (seconds).
BACKOFF_BASE_SECONDS = 0.005
BACKOFF_CAP_SECONDS = 0.25


@dataclass(frozen=True)
class KeyValue:
    """One etcd key as read. Revisions are etcd's int64 counters (``mod_revision`` changes on
    every write of the key)."""

    key: bytes
    value: bytes
    mod_revision: int
    create_revision: int
    version: int


@dataclass(frozen=True)
class CasResult:
    """A compare-and-swap's answer. ``current`` is the key after a *lost* compare (None =
    absent); it is None after a success."""

    succeeded: bool
    current: KeyValue | None = None


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _prefix_end(prefix: bytes) -> bytes:
    """etcd's range_end for "every key starting with ``prefix``"."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\x00"  # every key


def _int(value: Any, what: str) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError) as exc:
        raise LockError(f"etcd answered a non-integer {what}: {value!r}") from exc


def _kv(raw: Any) -> KeyValue:
    if not isinstance(raw, dict):
        raise LockError("etcd answered a malformed key-value")
    try:
        key = base64.b64decode(raw.get("key", ""), validate=True)
        value = base64.b64decode(raw.get("value", ""), validate=True)
    except (TypeError, ValueError) as exc:
        raise LockError("etcd answered a key or value that is not base64") from exc
    return KeyValue(
        key=key,
        value=value,
        mod_revision=_int(raw.get("mod_revision"), "mod_revision"),
        create_revision=_int(raw.get("create_revision"), "create_revision"),
        version=_int(raw.get("version"), "version"),
    )


def _kvs(range_response: Any) -> list[KeyValue]:
    if not isinstance(range_response, dict):
        raise LockError("etcd answered a malformed range response")
    kvs = range_response.get("kvs") or []
    if not isinstance(kvs, list):
        raise LockError("etcd answered a malformed range response")
    return [_kv(item) for item in kvs]


class _EndpointFailed(Exception):
    """This endpoint could not answer; try the next one. Carries the reason for the log."""


class EtcdKV:
    """A minimal etcd v3 KV client (see the module docstring for its failure rules).

    ``endpoints`` are base URLs (``http://127.0.0.1:2379``), tried in order starting from the
    last one that answered. ``request_timeout_seconds`` bounds each HTTP exchange.
    """

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        request_timeout_seconds: float = DEFAULT_REQUEST_TIMEOUT_SECONDS,
    ) -> None:
        if not endpoints:
            raise ValueError("at least one etcd endpoint is required")
        self._endpoints = [e.rstrip("/") for e in endpoints]
        self._timeout_seconds = request_timeout_seconds
        self._current = 0
        self._api_prefix: dict[str, str] = {}
        self._session: aiohttp.ClientSession | None = None

    @property
    def endpoints(self) -> list[str]:
        return list(self._endpoints)

    async def close(self) -> None:
        """End the HTTP session. Safe to call twice."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- KV operations -----------------------------------------------------------------------

    async def get(self, key: bytes) -> KeyValue | None:
        """The key's value and revisions, or None if absent. Raises ``LockError``."""
        kvs = _kvs(await self._call("/kv/range", {"key": _b64(key)}))
        return kvs[0] if kvs else None

    async def get_prefix(self, prefix: bytes, limit: int) -> tuple[list[KeyValue], bool]:
        """Up to ``limit`` keys starting with ``prefix``, in key order, and whether more exist.
        Raises ``LockError``."""
        body = {"key": _b64(prefix), "range_end": _b64(_prefix_end(prefix)), "limit": str(limit)}
        response = await self._call("/kv/range", body)
        return _kvs(response), bool(response.get("more", False))

    async def put_if(self, key: bytes, value: bytes, mod_revision: int) -> CasResult:
        """Store ``value`` if the key's ``mod_revision`` is still ``mod_revision`` (0: only if
        the key is absent). Raises ``LockError``; a lost compare is not an error."""
        put = {"request_put": {"key": _b64(key), "value": _b64(value)}}
        return await self._txn(key, mod_revision, put)

    async def delete_if(self, key: bytes, mod_revision: int) -> CasResult:
        """Delete the key if its ``mod_revision`` is still ``mod_revision``. Raises
        ``LockError``; a lost compare is not an error."""
        return await self._txn(key, mod_revision, {"request_delete_range": {"key": _b64(key)}})

    async def _txn(self, key: bytes, mod_revision: int, operation: dict[str, Any]) -> CasResult:
        body = {
            "compare": [
                {
                    "key": _b64(key),
                    "target": "MOD",
                    "result": "EQUAL",
                    "mod_revision": str(mod_revision),
                }
            ],
            "success": [operation],
            "failure": [{"request_range": {"key": _b64(key)}}],
        }
        response = await self._call("/kv/txn", body)
        # proto3 JSON leaves out false booleans: no "succeeded" means the compare failed.
        if response.get("succeeded", False) is True:
            return CasResult(succeeded=True)
        responses = response.get("responses") or []
        if not isinstance(responses, list) or len(responses) != 1:
            raise LockError("etcd answered a malformed txn response")
        kvs = _kvs((responses[0] or {}).get("response_range"))
        return CasResult(succeeded=False, current=kvs[0] if kvs else None)

    # -- transport ---------------------------------------------------------------------------

    def _session_for_loop(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                # One session serves many concurrent lock calls; asyncio.timeout bounds each.
                connector=aiohttp.TCPConnector(limit=32),
                timeout=aiohttp.ClientTimeout(total=None),
            )
        return self._session

    async def _call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body`` to ``path`` on the first endpoint that answers, as a JSON object."""
        payload = json.dumps(body).encode()
        reasons: list[str] = []
        last: Exception | None = None
        count = len(self._endpoints)
        for step in range(count):
            index = (self._current + step) % count
            endpoint = self._endpoints[index]
            try:
                result = await self._post(endpoint, path, payload)
            except _EndpointFailed as exc:
                reasons.append(f"{endpoint}: {exc}")
                last = exc
                continue
            self._current = index
            return result
        raise LockError("etcd unavailable: " + "; ".join(reasons)) from last

    async def _post(self, endpoint: str, path: str, payload: bytes) -> dict[str, Any]:
        prefixes = [self._api_prefix[endpoint]] if endpoint in self._api_prefix else API_PREFIXES
        for prefix in prefixes:
            status, body = await self._exchange(endpoint + prefix + path, payload)
            if status == 404 and endpoint not in self._api_prefix:
                continue  # this etcd serves the gateway under another version prefix
            if status >= 500 or status == 404:
                raise _EndpointFailed(f"HTTP {status} {_message(body)}")
            if status != 200:
                raise LockError(f"etcd refused the request: HTTP {status} {_message(body)}")
            self._api_prefix[endpoint] = prefix
            try:
                decoded = json.loads(body)
            except ValueError as exc:
                raise LockError(f"etcd answered malformed JSON: {exc}") from exc
            if not isinstance(decoded, dict):
                raise LockError("etcd answered JSON that is not an object")
            return decoded
        raise _EndpointFailed("no etcd v3 JSON gateway (tried " + ", ".join(API_PREFIXES) + ")")

    async def _exchange(self, url: str, payload: bytes) -> tuple[int, bytes]:
        session = self._session_for_loop()
        try:
            async with asyncio.timeout(self._timeout_seconds):
                async with session.post(
                    url, data=payload, headers={"Content-Type": "application/json"}
                ) as response:
                    chunks: list[bytes] = []
                    size = 0
                    async for chunk in response.content.iter_chunked(64 * 1024):
                        size += len(chunk)
                        if size > MAX_RESPONSE_BYTES:
                            raise _EndpointFailed(f"response over {MAX_RESPONSE_BYTES} bytes")
                        chunks.append(chunk)
                    return response.status, b"".join(chunks)
        except TimeoutError as exc:
            raise _EndpointFailed(f"no answer within {self._timeout_seconds:g}s") from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise _EndpointFailed(f"{type(exc).__name__}: {exc}") from exc


def _message(body: bytes) -> str:
    """The gateway's error message (``{"error":…,"message":…,"code":…}``), else a snippet."""
    try:
        decoded = json.loads(body)
    except ValueError:
        return body[:200].decode("utf-8", errors="replace")
    if isinstance(decoded, dict):
        return str(decoded.get("message") or decoded.get("error") or "")[:200]
    return ""


class EtcdLock(RecordLock):
    """The ``Lock`` protocol on etcd key ``key`` admitting ``max_holders`` nodes.

    ``clock`` stamps ``created`` and judges expiry (kured uses the reading node's clock).
    ``kv`` shares an ``EtcdKV`` (its session and failover state) between locks; ``close()``
    then leaves it open for its owner. ``max_attempts`` bounds the CAS retries of one call.
    One instance may serve several node ids (the FleetLock server does); concurrent calls are
    safe, the store's compare orders them.
    """

    def __init__(
        self,
        endpoints: Sequence[str],
        key: str,
        max_holders: int,
        clock: Clock,
        *,
        kv: EtcdKV | None = None,
        request_timeout_seconds: float = DEFAULT_REQUEST_TIMEOUT_SECONDS,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    ) -> None:
        super().__init__(max_holders, clock, max_attempts)
        # Only ``draw`` is used (no state): concurrent calls share it safely.
        self._backoff = Backoff(BACKOFF_BASE_SECONDS, BACKOFF_CAP_SECONDS)
        self._owns_kv = kv is None
        self._kv = (
            kv
            if kv is not None
            else EtcdKV(endpoints, request_timeout_seconds=request_timeout_seconds)
        )
        self._key = key.encode()

    @property
    def key(self) -> str:
        return self._key.decode()

    async def close(self) -> None:
        """Close the HTTP session unless it was shared in through ``kv``."""
        if self._owns_kv:
            await self._kv.close()

    async def _read_record(self) -> LockRecord | None:
        current = await self._kv.get(self._key)
        return lockrecord.parse(current.value) if current is not None else None

    async def _change(self, transition: Transition) -> Outcome:
        current = await self._kv.get(self._key)
        for attempt in range(self._max_attempts):
            record = lockrecord.parse(current.value) if current is not None else None
            outcome = transition(record)
            if outcome.write is Write.KEEP:
                return outcome
            expected = current.mod_revision if current is not None else 0
            if outcome.write is Write.PUT:
                assert outcome.record is not None
                value = lockrecord.serialise(outcome.record)
                result = await self._kv.put_if(self._key, value, expected)
            else:
                result = await self._kv.delete_if(self._key, expected)
            if result.succeeded:
                return outcome
            if (attempt + 1) % IMMEDIATE_RETRIES:
                # The failure branch read the key in the same revision the compare lost to:
                # the freshest value there is. Retrying on it at once is what wins a busy key;
                # sleeping first would only let it go stale.
                current = result.current
            else:
                # Several losses in a row: a convoy. Back off with full jitter, then re-read.
                await asyncio.sleep(self._backoff.draw(attempt + 1))
                current = await self._kv.get(self._key)
        raise LockConflict(
            f"lock {self.key}: lost the compare-and-swap {self._max_attempts} times in a row"
        )
