"""``kured fleetlock``: a FleetLock server for Fedora CoreOS's Zincati, on the etcd lock.

Protocol (coreos/zincati ``docs/development/fleetlock/protocol.md``;
docs/reference/kured-behaviour.md §5): a counting semaphore per group with owned, recursive
slots.

* ``POST /v1/pre-reboot`` — RecursiveLock: take a slot in the client's group, or confirm the one
  it holds (a repeated lock never uses a second slot; field report B43). 200 on success.
* ``POST /v1/steady-state`` — UnlockIfHeld: release the client's slot; 200 whether or not it
  held one (airlock's and locksmith's rule, not poseidon's 423; Behaviours item 29).
* ``GET /v1/status`` — for operators, not part of the protocol: every configured group and
  every group with a stored semaphore, with its slot count and holders (B45: "which node holds
  the slot?").
* ``GET /metrics`` — Prometheus: slots, slots in use and holders per group, read from etcd at
  every scrape (``kured.locks.fleetlock_metrics``).

Both protocol endpoints require the header ``fleet-lock-protocol: true`` (exactly) and a JSON
body ``{"client_params": {"id": "<non-empty>", "group": "<[a-zA-Z0-9.-]+>"}}``. Validation runs
before anything touches etcd, so a refused request leaves the lock state unchanged.

Storage: group ``g`` is the ``EtcdLock`` on key ``<prefix>/g`` (compare-and-swap on its
``mod_revision``), holding kured's own lock record with the client id as ``nodeID``, TTL 0
(slots never expire: like airlock and poseidon, a node that never comes back keeps its slot
until an operator removes it) and ``unschedulable`` false. The slot count comes from the
*current* configuration on every request — ``group_slots[g]``, else ``default_slots`` for any
other group — so a changed config takes effect at the next request and existing holders are
kept (B45; airlock instead freezes the count when the key is created, and rejects unknown
groups). A lost compare is retried a few times (bounded); Zincati retries every ~5 min anyway.

Errors are JSON ``{"kind": …, "value": …}`` with ``Content-Type: application/json``; ``value``
is always a string (Zincati decodes both fields as strings, and falls back to
``generic_http_<code>`` otherwise). ``kind`` comes from this fixed set, because Zincati uses it
as a metric label:

=========================== ====== ===========================================================
kind                        status when
=========================== ====== ===========================================================
missing_protocol_header     400    ``fleet-lock-protocol`` absent or not exactly ``true``
invalid_body                400    not JSON, or no ``client_params`` object
invalid_client_id           400    ``id`` missing, not a string, empty, or over 256 chars
invalid_group               400    ``group`` missing, not a string, or not ``^[a-zA-Z0-9.-]+$``
                                   (at most 253 chars)
method_not_allowed          405    a method the route does not serve (GET on pre-reboot…)
not_found                   404    no such route
request_too_large           413    body over ``max_body_bytes``
failed_lock_semaphore_full  409    every slot of the group is held by other clients; ``value``
                                   names the group, its slot count and the holder ids
lock_store_unavailable      503    etcd unreachable, its record unreadable, or CAS retries
                                   exhausted: the state is unknown, try again later
internal_error              500    a bug (logged)
=========================== ====== ===========================================================
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from kit.clock import Clock, SystemClock
from kured.core import lockrecord
from kured.core.errors import ConfigurationError, LockError
from kured.locks.etcd import DEFAULT_REQUEST_TIMEOUT_SECONDS, EtcdKV, EtcdLock
from kured.locks.fleetlock_metrics import metrics

log = logging.getLogger("kured.fleetlock")

PROTOCOL_HEADER = "fleet-lock-protocol"
DEFAULT_PREFIX = "kured/fleetlock/groups"
DEFAULT_GROUP = "default"
GROUP_PATTERN = re.compile(r"[a-zA-Z0-9.-]+\Z", re.ASCII)
MAX_ID_CHARS = 256
MAX_GROUP_CHARS = 253
DEFAULT_MAX_BODY_BYTES = 64 * 1024
# The status page lists at most this many stored groups (and says when there are more).
MAX_STATUS_GROUPS = 1000

KINDS = frozenset(
    {
        "missing_protocol_header",
        "invalid_body",
        "invalid_client_id",
        "invalid_group",
        "method_not_allowed",
        "not_found",
        "request_too_large",
        "failed_lock_semaphore_full",
        "lock_store_unavailable",
        "internal_error",
    }
)


class FleetLockError(Exception):
    """A request refused with ``status`` and JSON ``{"kind": kind, "value": value}``."""

    def __init__(self, status: int, kind: str, value: str) -> None:
        assert kind in KINDS, kind
        super().__init__(f"{kind}: {value}")
        self.status = status
        self.kind = kind
        self.value = value


def error_response(status: int, kind: str, value: str) -> web.Response:
    return web.json_response({"kind": kind, "value": value}, status=status)


@dataclass(frozen=True)
class SlotConfig:
    """Reboot slots per group: ``group_slots[group]``, else ``default_slots``. Every count ≥ 1."""

    default_slots: int = 1
    group_slots: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        problems = []
        if self.default_slots < 1:
            problems.append(f"default_slots must be at least 1, not {self.default_slots}")
        for group, slots in self.group_slots.items():
            if not valid_group(group):
                problems.append(f"group {group!r} does not match ^[a-zA-Z0-9.-]+$")
            if slots < 1:
                problems.append(f"group {group!r}: slots must be at least 1, not {slots}")
        if problems:
            raise ConfigurationError(problems)

    def slots(self, group: str) -> int:
        return self.group_slots.get(group, self.default_slots)


def valid_group(group: str) -> bool:
    return len(group) <= MAX_GROUP_CHARS and GROUP_PATTERN.match(group) is not None


@dataclass(frozen=True)
class ClientParams:
    id: str
    group: str


def check_header(headers: Mapping[str, str]) -> None:
    """The protocol's guard against requests that arrived by accident (a redirect): the header
    must be exactly ``true``. Raises ``FleetLockError`` (400 ``missing_protocol_header``)."""
    header = headers.get(PROTOCOL_HEADER)
    if header != "true":
        got = "absent" if header is None else repr(header[:40])
        raise FleetLockError(
            400, "missing_protocol_header", f"header '{PROTOCOL_HEADER}: true' required ({got})"
        )


def parse_body(body: bytes) -> ClientParams:
    """``{"client_params": {"id", "group"}}`` validated. Raises ``FleetLockError`` (400)."""
    try:
        document = json.loads(body)
    except (ValueError, RecursionError) as exc:  # RecursionError: absurdly deep nesting
        raise FleetLockError(400, "invalid_body", f"body is not JSON: {exc}") from exc
    params = document.get("client_params") if isinstance(document, dict) else None
    if not isinstance(params, dict):
        raise FleetLockError(400, "invalid_body", 'body must be {"client_params": {...}}')
    client_id = params.get("id")
    if not isinstance(client_id, str) or not client_id or len(client_id) > MAX_ID_CHARS:
        raise FleetLockError(
            400,
            "invalid_client_id",
            f"client_params.id must be a non-empty string of at most {MAX_ID_CHARS} characters",
        )
    group = params.get("group")
    if not isinstance(group, str) or not valid_group(group):
        raise FleetLockError(
            400,
            "invalid_group",
            "client_params.group must match ^[a-zA-Z0-9.-]+$ "
            f"(at most {MAX_GROUP_CHARS} characters)",
        )
    return ClientParams(client_id, group)


class FleetLockService:
    """The semaphores behind the HTTP routes: one ``EtcdLock`` per group over a shared
    ``EtcdKV``. Methods raise ``LockError`` when etcd cannot be used; safe for concurrent
    requests (etcd's compare orders them)."""

    def __init__(self, kv: EtcdKV, prefix: str, slots: SlotConfig, clock: Clock) -> None:
        self._kv = kv
        self._prefix = prefix.rstrip("/")
        self.slots = slots
        self._clock = clock

    def key(self, group: str) -> str:
        return f"{self._prefix}/{group}"

    def lock(self, group: str) -> EtcdLock:
        # Built per request (cheap, no IO): the slot count is read from the current config, and
        # client-chosen group names never accumulate in memory.
        return EtcdLock(
            self._kv.endpoints, self.key(group), self.slots.slots(group), self._clock, kv=self._kv
        )

    async def lock_slot(self, params: ClientParams) -> tuple[bool, list[str]]:
        """RecursiveLock. Returns (held now, holder ids the answer was decided on)."""
        attempt = await self.lock(params.group).attempt(params.id, False, 0)
        return attempt.acquired, [holder.node_id for holder in attempt.holders]

    async def unlock_slot(self, params: ClientParams) -> None:
        """UnlockIfHeld."""
        await self.lock(params.group).release(params.id)

    async def status(self) -> dict[str, Any]:
        """``{"groups": {group: {"slots": n, "holders": [{"id", "created"}], ...}}, "more":
        bool}`` for configured groups and stored ones (a stored record that does not parse is
        shown with an ``error`` string instead of holders)."""
        prefix = (self._prefix + "/").encode()
        stored, more = await self._kv.get_prefix(prefix, MAX_STATUS_GROUPS)
        groups: dict[str, dict[str, Any]] = {
            group: {"slots": self.slots.slots(group), "holders": []}
            for group in sorted({DEFAULT_GROUP, *self.slots.group_slots})
        }
        for item in stored:
            group = item.key[len(prefix) :].decode("utf-8", errors="replace")
            entry: dict[str, Any] = {"slots": self.slots.slots(group), "holders": []}
            try:
                record = lockrecord.parse(item.value)
            except LockError as exc:
                entry["error"] = exc.message
            else:
                entry["holders"] = [
                    {"id": e.node_id, "created": e.created_raw or e.created_text}
                    for e in record.entries
                ]
            groups[group] = entry
        return {"groups": dict(sorted(groups.items())), "more": more}


SERVICE = web.AppKey("service", FleetLockService)
KV = web.AppKey("kv", EtcdKV)

_HTTP_KINDS = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The one place errors become ``{kind, value}`` responses."""
    try:
        return await handler(request)
    except FleetLockError as exc:
        return error_response(exc.status, exc.kind, exc.value)
    except LockError as exc:
        log.warning("lock store error on %s: %s", request.path, exc.message)
        return error_response(503, "lock_store_unavailable", exc.message)
    except web.HTTPException as exc:
        kind = _HTTP_KINDS.get(exc.status)
        if kind is None:
            raise
        response = error_response(exc.status, kind, exc.reason)
        if "Allow" in exc.headers:
            response.headers["Allow"] = exc.headers["Allow"]
        return response
    except Exception:
        log.exception("unexpected error on %s %s", request.method, request.path)
        return error_response(500, "internal_error", "unexpected server error (logged)")


async def _params(request: web.Request) -> ClientParams:
    # Header first: a request that reached us by accident is refused before its body is read.
    check_header(request.headers)
    return parse_body(await request.read())


async def pre_reboot(request: web.Request) -> web.Response:
    params = await _params(request)
    service = request.app[SERVICE]
    held, holders = await service.lock_slot(params)
    if not held:
        slots = service.slots.slots(params.group)
        raise FleetLockError(
            409,
            "failed_lock_semaphore_full",
            f"all {slots} slot(s) of group {params.group!r} are held; holders: {', '.join(holders)}",
        )
    return web.json_response({"group": params.group, "id": params.id, "held": True})


async def steady_state(request: web.Request) -> web.Response:
    params = await _params(request)
    await request.app[SERVICE].unlock_slot(params)
    return web.json_response({"group": params.group, "id": params.id, "held": False})


async def status(request: web.Request) -> web.Response:
    return web.json_response(await request.app[SERVICE].status())


def build_app(
    etcd_endpoints: Sequence[str],
    *,
    prefix: str = DEFAULT_PREFIX,
    default_slots: int = 1,
    group_slots: Mapping[str, int] | None = None,
    clock: Clock | None = None,
    request_timeout_seconds: float = DEFAULT_REQUEST_TIMEOUT_SECONDS,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> web.Application:
    """The FleetLock ``web.Application``. Raises ``ConfigurationError`` listing every bad slot
    setting. Its etcd session is closed on the application's cleanup."""
    slots = SlotConfig(default_slots, dict(group_slots or {}))
    kv = EtcdKV(etcd_endpoints, request_timeout_seconds=request_timeout_seconds)
    app = web.Application(middlewares=[_errors], client_max_size=max_body_bytes)
    app[KV] = kv
    app[SERVICE] = FleetLockService(kv, prefix, slots, clock or SystemClock())
    app.router.add_post("/v1/pre-reboot", pre_reboot)
    app.router.add_post("/v1/steady-state", steady_state)
    app.router.add_get("/v1/status", status, allow_head=False)
    app.router.add_get("/metrics", metrics, allow_head=False)

    async def close_kv(app: web.Application) -> None:
        await app[KV].close()

    app.on_cleanup.append(close_kv)
    return app


async def serve(
    host: str,
    port: int,
    etcd_endpoints: Sequence[str],
    prefix: str = DEFAULT_PREFIX,
    default_slots: int = 1,
    group_slots: Mapping[str, int] | None = None,
    *,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Serve FleetLock on ``host:port`` (0: the OS picks) until cancelled, then shut down
    cleanly. Prints ``kured fleetlock listening http://host:port`` to stdout once bound and
    calls ``on_ready`` with that URL. Raises ``ConfigurationError`` before binding."""
    app = build_app(
        etcd_endpoints, prefix=prefix, default_slots=default_slots, group_slots=group_slots
    )
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = runner.addresses[0]
        url = f"http://{bound[0]}:{bound[1]}"
        print(f"kured fleetlock listening {url}", flush=True)
        log.info("fleetlock serving %s, etcd %s, prefix %s", url, list(etcd_endpoints), prefix)
        if on_ready is not None:
            on_ready(url)
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
