"""Poll a condition until it holds or a deadline passes: the one "wait until ready" of the
launchers, ``kura dev``, the tests and bench/.

Use it where nothing can be awaited instead (another process's state, a file, a metric): an
event, a task or a process's exit is waited on directly.

Both forms evaluate the condition at once, then every ``interval`` seconds, and once more when
the deadline comes, so a condition that holds in time is never reported as a timeout. A
timeout raises nothing: it returns False (callers ``assert`` it, or raise their own error
naming what did not become ready). An exception from the condition propagates, except those
listed in ``ignoring``, which count as "not yet" (a server that does not answer yet:
``OSError``).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable

DEFAULT_INTERVAL_SECONDS = 0.05


def wait_until(
    condition: Callable[[], object],
    timeout_seconds: float,
    *,
    interval: float = DEFAULT_INTERVAL_SECONDS,
    ignoring: tuple[type[BaseException], ...] = (),
    give_up: Callable[[], bool] | None = None,
) -> bool:
    """True as soon as ``condition()`` is truthy; False once ``timeout_seconds`` (monotonic
    clock) passed without it, or as soon as ``give_up()`` is true (a process it waits on
    exited: no use waiting longer). Sleeps ``interval`` seconds between evaluations, with
    ``time.sleep`` (blocking: never call it on an event loop, use ``wait_until_async``)."""
    deadline = time.monotonic() + timeout_seconds
    while True:
        try:
            if condition():
                return True
        except ignoring:
            pass
        left = deadline - time.monotonic()
        if left <= 0 or (give_up is not None and give_up()):
            return False
        time.sleep(min(interval, left))


async def wait_until_async(
    condition: Callable[[], object | Awaitable[object]],
    timeout_seconds: float,
    *,
    interval: float = DEFAULT_INTERVAL_SECONDS,
    ignoring: tuple[type[BaseException], ...] = (),
) -> bool:
    """``wait_until`` for a coroutine: ``condition`` may be a plain function or return an
    awaitable (an HTTP probe); the pauses are ``asyncio.sleep`` and the clock the running
    loop's. True as soon as the condition holds, False once ``timeout_seconds`` passed, even
    while an awaited condition hangs (it is cancelled at the deadline). Cancelling the awaiting
    task cancels the wait (CancelledError propagates)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_seconds
    while True:
        try:
            async with asyncio.timeout_at(deadline):
                held = condition()
                if inspect.isawaitable(held):
                    held = await held
            if held:
                return True
        except TimeoutError:
            return False
        except ignoring:
            pass
        left = deadline - loop.time()
        if left <= 0:
            return False
        await asyncio.sleep(min(interval, left))
