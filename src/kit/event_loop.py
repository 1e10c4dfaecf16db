"""Which asyncio event loop a process runs: the standard library's, or uvloop's.

uvloop (https://github.com/MagicStack/uvloop) is a drop-in event loop on libuv. ``choose``
resolves a setting of ``auto``, ``asyncio`` or ``uvloop`` to the loop to build, and ``run``
runs a coroutine on it with ``asyncio.Runner`` (Python 3.11+), which is what ``asyncio.run``
does with the default loop. ``running_loop_name`` reports which loop is running, read from the
loop object itself, so a log line or a status field tells the truth whatever was asked for.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

EVENT_LOOPS = ("auto", "asyncio", "uvloop")


def choose(setting: str) -> tuple[str, Callable[[], asyncio.AbstractEventLoop] | None]:
    """(the loop's name, its factory; None for the standard loop) for ``setting``.

    ``auto`` is uvloop when it can be imported, else asyncio. Raises ``ValueError`` for a
    setting outside ``EVENT_LOOPS`` and ``ImportError`` for ``uvloop`` when it is not installed.
    """
    if setting not in EVENT_LOOPS:
        raise ValueError(f"event loop must be one of {', '.join(EVENT_LOOPS)}, not {setting!r}")
    if setting == "asyncio":
        return "asyncio", None
    try:
        uvloop = importlib.import_module("uvloop")
    except ImportError:
        if setting == "uvloop":
            raise
        return "asyncio", None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return "uvloop", factory


def run(main: Coroutine[Any, Any, T], setting: str) -> T:
    """Run ``main`` to completion on the loop ``setting`` chooses, like ``asyncio.run``."""
    _name, factory = choose(setting)
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


def running_loop_name() -> str:
    """``uvloop`` or ``asyncio``: the loop running the caller (raises ``RuntimeError`` when
    none is)."""
    loop = asyncio.get_running_loop()
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"
