"""``kura.api.public_load``'s middleware on a real aiohttp server (127.0.0.1, OS-chosen port):
a public request counts as in flight until its body is sent, whatever way the response ends,
and probes do not count."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

from kit.clock import SystemClock
from kit.wait import wait_until_async
from kura.api.http import SPEC_ATTR, EndpointSpec, Handler
from kura.api.public_load import middleware
from kura.mesh.peer_pace import PublicLoad

MiB = 1024 * 1024


def declared(protocol: str, handler: Handler) -> Handler:
    """``handler`` with the spec ``kura.api.http.endpoint`` would give it (no auth, no ctx)."""
    setattr(handler, SPEC_ATTR, EndpointSpec(protocol, None, "json", None))
    return handler


async def wait_until(predicate: Callable[[], bool]) -> bool:
    """True once ``predicate()`` holds (a counter: no event to wait on), False after 20 s."""
    return await wait_until_async(predicate, 20, interval=0.01)


def serve(
    tmp_path: Path, body: Callable[[TestServer, PublicLoad, asyncio.Event], Awaitable[None]]
) -> PublicLoad:
    load = PublicLoad(SystemClock(), target_seconds=0.1)
    big = tmp_path / "big"
    big.write_bytes(b"b" * (64 * MiB))
    release = asyncio.Event()

    async def streamed(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        await response.write(b"first")
        await release.wait()
        await response.write(b"last")
        return response

    async def memory(_request: web.Request) -> web.StreamResponse:
        return web.Response(body=b"m" * (64 * MiB))

    async def file(_request: web.Request) -> web.StreamResponse:
        return web.FileResponse(big)

    async def missing(_request: web.Request) -> web.StreamResponse:
        raise web.HTTPNotFound()

    async def probe(_request: web.Request) -> web.StreamResponse:
        return web.json_response({"inflight": load.inflight})

    async def main() -> None:
        app = web.Application(middlewares=[middleware(load)])
        app.router.add_get("/streamed", declared("http_cache", streamed))
        app.router.add_get("/memory", declared("http_cache", memory))
        app.router.add_get("/file", declared("http_cache", file))
        app.router.add_get("/missing", declared("http_cache", missing))
        app.router.add_get("/up", declared("probe", probe))
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        try:
            await body(server, load, release)
        finally:
            await server.close()

    asyncio.run(main())
    return load


def test_in_flight_until_the_body_is_sent_and_probes_do_not_count(tmp_path: Path) -> None:
    seen: dict[str, int] = {}

    async def body(server: TestServer, load: PublicLoad, release: asyncio.Event) -> None:
        async with aiohttp.ClientSession() as session:
            r = await session.get(server.make_url("/streamed"))
            assert await r.content.readexactly(5) == b"first"
            seen["streaming"] = load.inflight
            async with session.get(server.make_url("/up")) as probe:
                seen["probe"] = (await probe.json())["inflight"]
            release.set()
            assert await r.read() == b"last"
            assert await wait_until(lambda: load.inflight == 0)
            async with session.get(server.make_url("/missing")) as gone:
                assert gone.status == 404
            seen["after_404"] = load.inflight
            async with session.get(server.make_url("/memory")) as whole:
                assert len(await whole.read()) == 64 * MiB
            assert await wait_until(lambda: load.inflight == 0)

    load = serve(tmp_path, body)
    assert seen == {"streaming": 1, "probe": 1, "after_404": 0}
    assert load.inflight == 0
    assert load.latency_ewma_seconds() > 0


def test_a_client_that_goes_away_mid_body_ends_its_flight(tmp_path: Path) -> None:
    """The leak to rule out: a response whose body is never finished must not stay counted
    (it would slow peer traffic for good). A client reads the headers of a 64 MiB body from
    memory and one sent with sendfile, then closes its connection."""
    counts: list[int] = []

    async def body(server: TestServer, load: PublicLoad, release: asyncio.Event) -> None:
        for path in ("/memory", "/file"):
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            await writer.drain()
            assert (await reader.readline()).startswith(b"HTTP/1.1 200")
            counts.append(load.inflight)
            writer.transport.abort()
            assert await wait_until(lambda: load.inflight == 0), path

    load = serve(tmp_path, body)
    assert counts == [1, 1]
    assert load.inflight == 0
