"""``read_ahead``: an async iterator whose next item is fetched while the caller handles the
current one.

A streaming sender that awaits each send before it asks its source for the next item leaves the
source idle while a message goes out, and the connection idle while the source works (a read
from disk, a copy in a thread). With one item fetched ahead the two overlap; a stalled receiver
holds at most that one item more.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TypeVar

T = TypeVar("T")


async def read_ahead(source: AsyncGenerator[T, None]) -> AsyncIterator[T]:
    """The items of ``source`` in order, each next one fetched (as a task) as soon as the
    current one is handed out. Exceptions of ``source`` are raised where its item would have
    been. When this iterator is closed early (``aclose``, a cancelled caller), the fetch under
    way is cancelled and ``source`` closed before ``aclose`` returns."""
    fetch: asyncio.Future[T] = asyncio.ensure_future(anext(source))
    try:
        while True:
            try:
                item = await fetch
            except StopAsyncIteration:
                return
            fetch = asyncio.ensure_future(anext(source))
            yield item
    finally:
        if not fetch.done():
            fetch.cancel()
        with contextlib.suppress(BaseException):
            await fetch  # the source is not running when it is closed
        await source.aclose()
