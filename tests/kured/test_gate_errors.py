"""Gate errors read as sentences (issue 15): the Prometheus gate and the HTTP gates against
real sockets on 127.0.0.1 - a closed port, a server that never answers, an answer that is not
JSON - name the URL and say what went wrong, never a client exception's repr."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from kura_harness.launch.process import free_ports
from kured.sensors.alerts import PrometheusAlertGate
from kured.sensors.http_gate import HttpGate


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


@pytest.fixture
async def server() -> AsyncIterator[str]:
    """Routes: /hang never answers, /text answers 200 text/plain that is not JSON."""

    done = asyncio.Event()

    async def hang(_request: web.Request) -> web.Response:
        await done.wait()  # until the test ends
        return web.Response()

    async def text(_request: web.Request) -> web.Response:
        return web.Response(text="<html>proxy error</html>")

    app = web.Application()
    app.router.add_route("*", "/hang/api/v1/query", hang)
    app.router.add_route("*", "/hang", hang)
    app.router.add_route("*", "/text/api/v1/query", text)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield f"http://127.0.0.1:{port}"
    done.set()
    await runner.cleanup()


def prometheus(session: aiohttp.ClientSession, url: str) -> PrometheusAlertGate:
    return PrometheusAlertGate(session, url, None, False, False, timeout_seconds=0.5)


async def test_a_closed_port_is_connection_refused(session: aiohttp.ClientSession) -> None:
    (port,) = free_ports(1)
    url = f"http://127.0.0.1:{port}"
    result = await prometheus(session, url).check()
    assert result.blocking is None
    assert result.detail == f"Prometheus at {url} unreachable: connection refused"
    gate = await HttpGate(session, url + "/ready", 0.5).check()
    assert gate.blocking is None
    assert gate.detail == f"gate {url}/ready unreachable: connection refused"


async def test_no_answer_names_the_timeout(session: aiohttp.ClientSession, server: str) -> None:
    result = await prometheus(session, server + "/hang").check()
    assert result.detail == f"Prometheus at {server}/hang unreachable: no answer within 0.5s"
    gate = await HttpGate(session, server + "/hang", 0.5).check()
    assert gate.detail == f"gate {server}/hang unreachable: no answer within 0.5s"


async def test_an_answer_that_is_not_json_says_so(
    session: aiohttp.ClientSession, server: str
) -> None:
    result = await prometheus(session, server + "/text").check()
    assert result.blocking is None
    assert result.detail == f"Prometheus at {server}/text unreachable: the answer is not valid JSON"


async def test_an_unresolvable_host_says_which(session: aiohttp.ClientSession) -> None:
    result = await prometheus(session, "http://prometheus.invalid:9090").check()
    assert result.blocking is None
    assert "Prometheus at http://prometheus.invalid:9090 unreachable: " in result.detail
    assert "Error" not in result.detail
