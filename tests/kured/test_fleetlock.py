"""The FleetLock server over real HTTP on 127.0.0.1, its semaphores in a real etcd.

Scenarios are field reports B43 (recursive lock, unlock-if-held), B45 (per-group slots, the
"semaphore full" answer naming the holders, config changes) and B46 (protocol header, body
validation, error JSON with kinds from a fixed set) (coreos/zincati #756, coreos/airlock #81, coreos/zincati PR #350 and PR #385),
and the FleetLock protocol as Zincati documents it (coreos/zincati, docs/development/fleetlock).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from kured.core import lockrecord
from kured.core.errors import ConfigurationError
from kured.locks.etcd import EtcdKV
from kured.locks.fleetlock import KINDS, build_app, serve

HEADERS = {"fleet-lock-protocol": "true"}


@dataclass
class Reply:
    status: int
    body: Any
    content_type: str


@dataclass
class Server:
    """A running FleetLock app and a client for it."""

    url: str
    session: aiohttp.ClientSession
    runner: web.AppRunner

    async def post(
        self, path: str, body: object | bytes, headers: Mapping[str, str] | None = None
    ) -> Reply:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        async with self.session.post(
            self.url + path, data=data, headers=HEADERS if headers is None else headers
        ) as response:
            return await _reply(response)

    async def lock(self, client_id: str, group: str = "default") -> Reply:
        return await self.post("/v1/pre-reboot", params(client_id, group))

    async def unlock(self, client_id: str, group: str = "default") -> Reply:
        return await self.post("/v1/steady-state", params(client_id, group))

    async def status(self) -> dict[str, Any]:
        async with self.session.get(self.url + "/v1/status") as response:
            assert response.status == 200
            result: dict[str, Any] = await response.json()
            return result

    async def holders(self, group: str = "default") -> list[str]:
        groups = (await self.status())["groups"]
        return [h["id"] for h in groups.get(group, {"holders": []})["holders"]]

    async def stop(self) -> None:
        await self.runner.cleanup()


async def _reply(response: aiohttp.ClientResponse) -> Reply:
    text = await response.text()
    try:
        body: Any = json.loads(text) if text else None
    except ValueError:
        body = text
    return Reply(response.status, body, response.content_type)


def params(client_id: str, group: str = "default") -> dict[str, Any]:
    return {"client_params": {"id": client_id, "group": group}}


StartServer = Callable[..., Awaitable[Server]]


@pytest.fixture
async def start_server(etcd: str, fleetlock_prefix: str) -> AsyncIterator[StartServer]:
    """``await start_server(default_slots=1, group_slots=None)``: a FleetLock app on an
    OS-chosen port of 127.0.0.1 against the test's etcd. All stopped at the end."""
    servers: list[Server] = []
    session = aiohttp.ClientSession()

    async def start(default_slots: int = 1, group_slots: Mapping[str, int] | None = None) -> Server:
        app = build_app(
            [etcd], prefix=fleetlock_prefix, default_slots=default_slots, group_slots=group_slots
        )
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        server = Server(f"http://{host}:{port}", session, runner)
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.stop()
    await session.close()


def assert_error(reply: Reply, status: int, kind: str) -> None:
    assert reply.status == status, reply
    assert reply.content_type == "application/json"
    assert isinstance(reply.body, dict)
    assert set(reply.body) == {"kind", "value"}
    assert reply.body["kind"] == kind
    assert kind in KINDS
    assert isinstance(reply.body["value"], str)
    assert reply.body["value"]


# --- B43: recursive lock, unlock-if-held -------------------------------------------------------


async def test_repeated_pre_reboot_is_idempotent_and_one_unlock_frees(
    start_server: StartServer,
) -> None:
    server = await start_server(default_slots=1)
    for _ in range(10):
        assert (await server.lock("c1")).status == 200
    assert await server.holders() == ["c1"]  # one slot used, not ten
    assert_error(await server.lock("c2"), 409, "failed_lock_semaphore_full")
    assert (await server.unlock("c1")).status == 200  # one unlock, not ten
    assert await server.holders() == []
    assert (await server.unlock("c1")).status == 200  # unlock-if-held: not held is fine
    assert (await server.unlock("c3")).status == 200  # never locked
    assert (await server.lock("c2")).status == 200
    assert await server.holders() == ["c2"]


async def test_unlock_by_a_non_holder_leaves_the_holder_in_place(
    start_server: StartServer,
) -> None:
    server = await start_server(default_slots=1)
    assert (await server.lock("c1")).status == 200
    assert (await server.unlock("intruder")).status == 200  # 200, not poseidon's 423
    assert await server.holders() == ["c1"]


async def test_concurrent_identical_locks_use_one_slot(start_server: StartServer) -> None:
    server = await start_server(default_slots=2)
    replies = await asyncio.gather(*(server.lock("c1") for _ in range(20)))
    assert {r.status for r in replies} == {200}
    assert await server.holders() == ["c1"]


# --- B45: per-group slots ----------------------------------------------------------------------


async def test_groups_have_their_own_slot_counts(start_server: StartServer) -> None:
    server = await start_server(default_slots=3, group_slots={"cluster": 1})
    assert (await server.lock("c1", "cluster")).status == 200
    full = await server.lock("c2", "cluster")
    assert_error(full, 409, "failed_lock_semaphore_full")
    assert "c1" in full.body["value"]
    for client in ("c3", "c4", "c5"):  # the cluster holder does not count against default
        assert (await server.lock(client, "default")).status == 200
    full = await server.lock("c6", "default")
    assert_error(full, 409, "failed_lock_semaphore_full")
    for holder in ("c3", "c4", "c5"):  # the answer names who holds the slots
        assert holder in full.body["value"]
    assert "all 3 slot(s)" in full.body["value"]


async def test_unknown_group_gets_default_slots_in_its_own_semaphore(
    start_server: StartServer,
) -> None:
    server = await start_server(default_slots=2, group_slots={"cluster": 1})
    assert (await server.lock("a", "default")).status == 200
    assert (await server.lock("b", "default")).status == 200
    assert (await server.lock("g1", "gpu")).status == 200
    assert (await server.lock("g2", "gpu")).status == 200
    assert_error(await server.lock("g3", "gpu"), 409, "failed_lock_semaphore_full")
    status = await server.status()
    assert status["groups"]["gpu"]["slots"] == 2
    assert [h["id"] for h in status["groups"]["gpu"]["holders"]] == ["g1", "g2"]
    assert [h["id"] for h in status["groups"]["default"]["holders"]] == ["a", "b"]
    assert status["groups"]["cluster"] == {"slots": 1, "holders": []}  # configured, unused
    assert status["more"] is False


async def test_changed_slot_config_takes_effect_and_keeps_holders(
    start_server: StartServer,
) -> None:
    first = await start_server(default_slots=3, group_slots={"cluster": 1})
    assert (await first.lock("c1", "cluster")).status == 200
    assert_error(await first.lock("c2", "cluster"), 409, "failed_lock_semaphore_full")
    await first.stop()
    restarted = await start_server(default_slots=3, group_slots={"cluster": 2})
    assert await restarted.holders("cluster") == ["c1"]
    assert (await restarted.lock("c2", "cluster")).status == 200
    assert await restarted.holders("cluster") == ["c1", "c2"]
    assert (await restarted.status())["groups"]["cluster"]["slots"] == 2


async def test_semaphores_are_stored_as_kured_lock_records(
    start_server: StartServer, etcd: str, fleetlock_prefix: str
) -> None:
    server = await start_server(default_slots=1, group_slots={"pool": 2})
    assert (await server.lock("c1", "default")).status == 200
    assert (await server.lock("p1", "pool")).status == 200
    kv = EtcdKV([etcd])
    try:
        single = await kv.get(f"{fleetlock_prefix}/default".encode())
        multi = await kv.get(f"{fleetlock_prefix}/pool".encode())
    finally:
        await kv.close()
    assert single is not None
    assert multi is not None
    assert single.value.startswith(b'{"nodeID":"c1","metadata":{"unschedulable":false},"created":"')
    assert single.value.endswith(b'","TTL":0}')
    assert multi.value.startswith(b'{"maxOwners":2,"locks":[{"nodeID":"p1",')
    for raw in (single.value, multi.value):
        assert lockrecord.serialise(lockrecord.parse(raw)) == raw


# --- B46: protocol guard, validation, error format ---------------------------------------------


async def test_missing_protocol_header_is_refused_and_changes_nothing(
    start_server: StartServer,
) -> None:
    server = await start_server(default_slots=1)
    assert (await server.lock("c1")).status == 200
    for headers in ({}, {"fleet-lock-protocol": "false"}, {"fleet-lock-protocol": "yes"}):
        reply = await server.post("/v1/steady-state", params("c1"), headers=headers)
        assert_error(reply, 400, "missing_protocol_header")
        reply = await server.post("/v1/pre-reboot", params("c2"), headers=headers)
        assert_error(reply, 400, "missing_protocol_header")
    assert await server.holders() == ["c1"]


@pytest.mark.parametrize(
    ("body", "kind"),
    [
        (params("", "default"), "invalid_client_id"),
        ({"client_params": {"id": 5, "group": "default"}}, "invalid_client_id"),
        ({"client_params": {"group": "default"}}, "invalid_client_id"),
        (params("x" * 257), "invalid_client_id"),
        (params("c1", "bad group!"), "invalid_group"),
        (params("c1", ""), "invalid_group"),
        (params("c1", "a/b"), "invalid_group"),
        ({"client_params": {"id": "c1"}}, "invalid_group"),
        (b"{not json", "invalid_body"),
        (b"", "invalid_body"),
        (b"[" * 50_000, "invalid_body"),
        ({"id": "c1", "group": "default"}, "invalid_body"),
        ({"client_params": "c1"}, "invalid_body"),
        ([1, 2], "invalid_body"),
    ],
)
async def test_invalid_bodies_are_refused_with_their_kind(
    start_server: StartServer, body: object, kind: str
) -> None:
    server = await start_server()
    for path in ("/v1/pre-reboot", "/v1/steady-state"):
        assert_error(await server.post(path, body), 400, kind)
    assert (await server.status())["groups"] == {"default": {"slots": 1, "holders": []}}


async def test_groups_allowed_by_the_spec_pattern_are_accepted(start_server: StartServer) -> None:
    server = await start_server()
    for group in ("workers", "tier-1.eu", "A.B-9"):
        assert (await server.lock("c1", group)).status == 200


async def test_wrong_methods_and_paths_get_json_errors(start_server: StartServer) -> None:
    server = await start_server()
    for method in ("GET", "PUT", "DELETE"):
        for path in ("/v1/pre-reboot", "/v1/steady-state"):
            async with server.session.request(method, server.url + path, headers=HEADERS) as r:
                reply = await _reply(r)
                assert r.headers["Allow"] == "POST"
            assert_error(reply, 405, "method_not_allowed")
    async with server.session.post(server.url + "/v1/status", headers=HEADERS) as r:
        assert_error(await _reply(r), 405, "method_not_allowed")
    assert_error(await server.post("/v1/nope", params("c1")), 404, "not_found")
    too_big = params("c1") | {"padding": "x" * 70_000}
    assert_error(await server.post("/v1/pre-reboot", too_big), 413, "request_too_large")


async def test_success_is_200_with_a_json_body(start_server: StartServer) -> None:
    server = await start_server()
    reply = await server.lock("c1")
    assert (reply.status, reply.body) == (200, {"group": "default", "id": "c1", "held": True})
    reply = await server.unlock("c1")
    assert (reply.status, reply.body) == (200, {"group": "default", "id": "c1", "held": False})


async def test_unreachable_etcd_is_a_503_from_the_fixed_set() -> None:
    app = build_app(["http://127.0.0.1:1"], request_timeout_seconds=1)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        async with aiohttp.ClientSession() as session:
            url = f"http://{host}:{port}/v1/pre-reboot"
            async with session.post(url, json=params("c1"), headers=HEADERS) as response:
                assert_error(await _reply(response), 503, "lock_store_unavailable")
    finally:
        await runner.cleanup()


def test_error_kinds_are_a_small_fixed_set() -> None:
    assert len(KINDS) <= 10
    assert all(kind.replace("_", "").isalpha() and kind.islower() for kind in KINDS)


def test_invalid_slot_config_is_reported_all_at_once() -> None:
    with pytest.raises(ConfigurationError) as raised:
        build_app(["http://127.0.0.1:1"], default_slots=0, group_slots={"bad group": 0})
    assert len(raised.value.problems) == 3


async def test_serve_listens_until_cancelled(etcd: str, fleetlock_prefix: str) -> None:
    ready: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(
        serve(
            "127.0.0.1", 0, [etcd], fleetlock_prefix, 1, {"cluster": 2}, on_ready=ready.set_result
        )
    )
    try:
        url = await asyncio.wait_for(ready, 10)
        async with aiohttp.ClientSession() as session:
            for client in ("c1", "c2"):
                body = params(client, "cluster")
                async with session.post(url + "/v1/pre-reboot", json=body, headers=HEADERS) as r:
                    assert r.status == 200
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
