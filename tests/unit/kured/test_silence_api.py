"""The silencer against answers that are not Alertmanager's API v2 shape (a tiny real HTTP
server): each is a ``SilenceError``, never a KeyError, AttributeError or TypeError; and the
silence keeper of the agent survives an unexpected error."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import aiohttp
import pytest
from aiohttp import web

from kit.wait import wait_until_async
from kured.actuators import silence
from kured.actuators.silence import SilenceError, Silencer
from kured.contract import AgentConfig, AgentView
from kured.core.silence_matchers import Matcher
from kured.maintenance import MaintenanceKit, MaintenanceSteps
from kured.state import AgentState, StateStore

MARK = "kured: reboot of node n1 (drained since 2026-01-01T00:00:00Z)"
NOW = datetime(2026, 12, 7, 3, 0, tzinfo=UTC)


class Fake:
    """What the fake Alertmanager answers: to GET the silences, to POST one."""

    def __init__(self) -> None:
        self.listing: Any = []
        self.posted: Any = {"silenceID": "s1"}
        self.posts = 0


@pytest.fixture
async def fake() -> AsyncIterator[tuple[Fake, str]]:
    box = Fake()

    async def get(_request: web.Request) -> web.Response:
        return web.json_response(box.listing)

    async def post(_request: web.Request) -> web.Response:
        box.posts += 1
        return web.json_response(box.posted)

    async def delete(_request: web.Request) -> web.Response:
        return web.Response()

    app = web.Application()
    app.router.add_get("/api/v2/silences", get)
    app.router.add_post("/api/v2/silences", post)
    app.router.add_delete("/api/v2/silence/{id}", delete)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield box, f"http://127.0.0.1:{runner.addresses[0][1]}"
    await runner.cleanup()


def _ours(**fields: Any) -> dict[str, Any]:
    return {"createdBy": "kured", "comment": MARK, **fields}


@pytest.mark.parametrize(
    ("listing", "posted"),
    [
        ([_ours(status={"state": "active"})], {"silenceID": "s1"}),  # ours, no id
        ([_ours(id="s0", status="active")], {"silenceID": "s1"}),  # status not an object
        ([_ours(id=7, status={"state": "active"})], {"silenceID": "s1"}),  # id not a string
        ({"silences": []}, {"silenceID": "s1"}),  # not a list
        ([], ["s1"]),  # the POST answer is a list
        ([], {"silenceID": 12}),  # silenceID not a string
        ([], "s1"),
    ],
)
async def test_a_non_conforming_answer_is_a_silence_error(
    fake: tuple[Fake, str], listing: Any, posted: Any
) -> None:
    box, url = fake
    box.listing, box.posted = listing, posted
    async with aiohttp.ClientSession() as session:
        silencer = Silencer(session, url, [Matcher("instance", "=", "%s")], "n1", 5)
        with pytest.raises(SilenceError, match=r"API v2|not a list"):
            await silencer.ensure(NOW, NOW, NOW)
        if not isinstance(listing, list) or listing:
            with pytest.raises(SilenceError):
                await silencer.expire_ours()


async def test_silences_of_others_need_not_conform(fake: tuple[Fake, str]) -> None:
    box, url = fake
    box.listing = [{"createdBy": "alice", "status": "weird"}, "junk", _ours(id="s0", status={})]
    async with aiohttp.ClientSession() as session:
        silencer = Silencer(session, url, [Matcher("instance", "=", "%s")], "n1", 5)
        assert await silencer.ensure(NOW, NOW, NOW) == "s1"
        assert await silencer.expire_ours() == []


class Steps(MaintenanceSteps):
    """Just enough of the agent for the silence keeper."""

    def __init__(self, silencer: Silencer, tmp_path: Path, sleep: Callable[[float], Any]) -> None:
        self.config = cast(AgentConfig, SimpleNamespace(node_id="n1"))
        self.view = AgentView()
        self.state = AgentState(maintenance_since=NOW.timestamp())
        self.store = StateStore(tmp_path, "n1")
        self.maintenance = MaintenanceKit(silencer=silencer, silence_duration_seconds=3)
        self.silence_sweep_pending = False
        self._keeper = None
        self.sleep = sleep

    def now(self) -> datetime:
        return NOW

    def _unix(self) -> float:
        return NOW.timestamp()


async def test_the_keeper_survives_a_non_conforming_answer_and_an_unexpected_error(
    fake: tuple[Fake, str], tmp_path: Path
) -> None:
    box, url = fake
    box.listing = [_ours(status={"state": "active"})]  # no id: a SilenceError each time
    async with aiohttp.ClientSession() as session:
        silencer = Silencer(session, url, [Matcher("instance", "=", "%s")], "n1", 5)
        calls = 0
        real_ensure = silencer.ensure

        async def ensure(*args: Any) -> str:
            nonlocal calls
            calls += 1
            if calls == 2:
                raise KeyError("a bug")  # not a SilenceError: the keeper goes on all the same
            return await real_ensure(*args)

        silencer.ensure = ensure  # type: ignore[method-assign]
        steps = Steps(silencer, tmp_path, lambda _s: asyncio.sleep(0.01))
        steps._start_keeper()
        try:
            assert await wait_until_async(lambda: calls >= 3, 10.0)
            assert steps.view.failures_total["silence"] >= 2
            box.listing = []
            assert await wait_until_async(lambda: steps.view.maintenance.silence_id == "s1", 10.0)
            assert steps._keeper is not None
            assert not steps._keeper.done()
        finally:
            await steps._stop_keeper()


async def test_answers_are_read_bounded_and_refusals_shown_escaped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A refusal that sends a forged log line then never ends; an answer larger than the
    limit (lowered to 1 MB here; the server sends 10 MB)."""
    monkeypatch.setattr(silence, "ANSWER_LIMIT_BYTES", 1 << 20)
    done = asyncio.Event()

    async def refuse(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(status=500)
        await response.prepare(request)
        await response.write(b"no\nFAKE LOG LINE" + b"x" * 100000)
        await done.wait()  # the answer never ends while the client reads
        return response

    async def huge(_request: web.Request) -> web.Response:
        return web.Response(body=b"[" + b" " * (10 << 20) + b"]")

    app = web.Application()
    app.router.add_post("/api/v2/silences", refuse)
    app.router.add_get("/api/v2/silences", huge)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        async with aiohttp.ClientSession() as session:
            silencer = Silencer(session, url, [Matcher("instance", "=", "%s")], "n1", 30)
            with pytest.raises(SilenceError, match="larger than 1048576 bytes"):
                await silencer.expire_ours()
            started = time.monotonic()
            with pytest.raises(SilenceError) as err:
                await silencer._call("POST", "/api/v2/silences", {})
            assert time.monotonic() - started < 10  # not the 30 s timeout
    finally:
        done.set()
        await runner.cleanup()
    assert "answered 500 to POST /api/v2/silences: no\\nFAKE LOG LINE" in err.value.message
    assert "\n" not in err.value.message
    assert len(err.value.message) < 400
