"""kit.wait: the one poll-until of the launchers, ``kura dev``, the tests and bench/."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from kit.wait import wait_until, wait_until_async


def test_true_once_the_condition_holds_and_ignored_errors_are_not_yet() -> None:
    calls = itertools.count(1)

    def third_time() -> bool:
        n = next(calls)
        if n == 1:
            raise OSError("not listening yet")
        return n >= 3

    assert wait_until(third_time, 10, interval=0.001, ignoring=(OSError,))
    assert next(calls) == 4  # evaluated three times, no more


def test_a_timeout_returns_false_after_a_last_look_and_other_errors_propagate() -> None:
    seen = []
    assert not wait_until(lambda: seen.append(1), 0.02, interval=0.005)
    assert len(seen) >= 2  # at once, then at least at the deadline

    def broken() -> bool:
        raise KeyError("a bug, not a slow start")

    with pytest.raises(KeyError):
        wait_until(broken, 10, ignoring=(OSError,))


def test_give_up_ends_the_wait_early() -> None:
    assert not wait_until(lambda: False, 60, give_up=lambda: True)


async def test_the_async_form_awaits_an_awaitable_condition() -> None:
    flag = asyncio.Event()
    asyncio.get_running_loop().call_later(0.02, flag.set)

    async def probe() -> bool:
        await asyncio.sleep(0)
        return flag.is_set()

    assert await wait_until_async(probe, 10, interval=0.005)
    assert not await wait_until_async(lambda: False, 0.02, interval=0.005)


async def test_the_async_wait_keeps_its_deadline_while_the_condition_hangs() -> None:
    """A probe that never answers (a node stopped with SIGSTOP) is cancelled at the deadline;
    before, a 0.2 s wait returned after the probe's own 3 s."""
    loop = asyncio.get_running_loop()
    started = loop.time()

    async def hangs() -> bool:
        await asyncio.sleep(3)
        return True

    assert await wait_until_async(hangs, 0.2) is False
    assert loop.time() - started < 1.0
