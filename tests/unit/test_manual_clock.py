"""kit.clock.ManualClock: the virtual clock kured's loop and drain run on in tests."""

from __future__ import annotations

import asyncio

import pytest

from kit.clock import ManualClock


@pytest.mark.parametrize("seconds", [0.0, -1.0])
async def test_a_timeout_already_due_fires_at_once_as_asyncio_timeout_does(seconds: float) -> None:
    clock = ManualClock()
    with pytest.raises(TimeoutError):
        async with clock.timeout(seconds):
            await asyncio.sleep(5)  # no one advances the clock: only a due deadline ends this


async def test_a_timeout_fires_when_the_clock_passes_it_and_not_before() -> None:
    clock = ManualClock()
    waiter = asyncio.Event()

    async def body() -> None:
        async with clock.timeout(10):
            await waiter.wait()

    task = asyncio.create_task(body())
    await asyncio.sleep(0)
    clock.advance(9.9)
    await asyncio.sleep(0)
    assert not task.done()
    clock.advance(0.2)
    with pytest.raises(TimeoutError):
        await task
