"""Refusals of an unspoken wire version on an injected clock (review of issue 31's wire
version): the receiver's refusal log keeps to one line per ``LOG_INTERVAL_SECONDS`` across
all senders and then counts those left out (``kura.api.internal.WireVersions``), and the
sender backs off from such a refusal (2 s doubling, ``kura.mesh.shipper``) and keeps the copy,
each decided on a ``ManualClock`` instead of asserted by sleeping.

The receiver is kura's own ``WireVersions`` middleware on an aiohttp server; the refusing peer
of the shipper answers as a kura of another wire does (503, ``Kura-Refusal: wire_version``),
which no configuration of a HEAD node can play (tests/e2e/test_wire_version.py runs such a
kura for real)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from kit.clock import ManualClock, SystemClock
from kit.wait import wait_until_async
from kura.api.internal import LOG_INTERVAL_SECONDS, WireVersions
from kura.core.versions import UNSPOKEN_WIRE_VERSION, WIRE_REFUSAL_STATUS
from kura.mesh.client import PeerClient
from kura.mesh.shipper import BACKOFF_START_SECONDS, Shipper
from kura.storage.budget import TmpBudget
from kura.storage.service import ArtifactRef, CacheService

MiB = 1024 * 1024
LINE = "refused a peer request from"


@contextlib.asynccontextmanager
async def serve(app: web.Application) -> AsyncIterator[str]:
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


async def test_the_refusal_log_keeps_one_line_per_interval_and_counts_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = ManualClock()
    versions = WireVersions(clock.monotonic)

    async def accepted(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application(middlewares=[versions.middleware])
    app.router.add_get("/_internal/bootstrap/manifests", accepted)
    caplog.set_level(logging.ERROR, logger="kura.api.internal")

    def lines() -> list[str]:
        return [r.getMessage() for r in caplog.records if LINE in r.getMessage()]

    async with serve(app) as url, aiohttp.ClientSession() as session:

        async def refused(wire: str) -> None:
            headers = {"Kura-Wire-Version": wire, "Kura-Version": "0.3.0"}
            async with session.get(url + "/_internal/bootstrap/manifests", headers=headers) as r:
                assert r.status == WIRE_REFUSAL_STATUS
                assert r.headers["Kura-Refusal"] == UNSPOKEN_WIRE_VERSION

        for wire in ("3", "3", "4"):  # two versions: the limit is one for all
            await refused(wire)
        assert len(lines()) == 1
        assert "(0 more refused since the last such line" in lines()[0]
        clock.advance(LOG_INTERVAL_SECONDS - 0.001)
        await refused("3")
        assert len(lines()) == 1
        clock.advance(0.001)
        await refused("3")
        assert len(lines()) == 2
        assert "(3 more refused since the last such line" in lines()[1]


async def test_the_shipper_backs_off_from_a_wire_refusal_and_keeps_the_copy(
    tmp_path: Path,
) -> None:
    attempts: list[str] = []

    async def other_wire(request: web.Request) -> web.Response:
        await request.read()
        attempts.append(request.path)
        return web.json_response(
            {"message": "kura 0.3.0 (wire 3) and this node ... cannot talk"},
            status=WIRE_REFUSAL_STATUS,
            headers={"Kura-Refusal": UNSPOKEN_WIRE_VERSION},
        )

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", other_wire)
    async with serve(app) as peer:
        service = CacheService(
            data_dir=tmp_path / "data",
            tmp_dir=tmp_path / "tmp",
            tenant_id="t",
            budget=TmpBudget(64 * MiB, tmp_dir=tmp_path / "tmp"),
            clock=SystemClock(),
            max_disk_bytes=1024 * MiB,
            min_free_disk_bytes=0,
            targets=lambda: (peer,),
        )
        await service.start()
        client = PeerClient("t", None)
        await client.start()
        clock = ManualClock()
        shipper = Shipper(service.reads, service.replica_log, client, clock, 60.0)
        task = asyncio.create_task(shipper.run())
        try:
            await service.put_inline(ArtifactRef("xcode", "ns", "k"), b"body", "text/plain")
            shipper.wake()
            assert await wait_until_async(lambda: len(attempts) == 1, 10)
            state = shipper.peers[peer]
            assert await wait_until_async(lambda: state.failures == 1, 10)
            first = state.backoff.delay_seconds
            # BACKOFF_JITTER: each pause within [ceiling / 2, ceiling]; ceiling 2 s, then 4 s.
            assert BACKOFF_START_SECONDS / 2 <= first <= BACKOFF_START_SECONDS
            assert state.backoff.until == clock.monotonic() + first
            assert state.backoff.waiting(clock.monotonic())
            clock.advance(first)  # the deadline: the next wake retries
            assert not state.backoff.waiting(clock.monotonic())
            shipper.wake()
            assert await wait_until_async(lambda: state.failures == 2, 10)
            assert len(attempts) == 2
            assert BACKOFF_START_SECONDS <= state.backoff.delay_seconds <= 2 * BACKOFF_START_SECONDS
            assert state.depth == 1  # kept, never dropped
            assert state.dropped_total == {}
            assert "answered 503" in state.last_error, state.last_error
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await client.close()
            await service.close()
