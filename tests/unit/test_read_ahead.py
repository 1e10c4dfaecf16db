"""``kit.read_ahead``: the next item is fetched while the caller holds the current one, errors
arrive in order, and closing early cancels the fetch and closes the source."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import pytest

from kit.read_ahead import read_ahead


def test_the_next_item_is_fetched_while_the_caller_holds_this_one() -> None:
    fetched: list[int] = []

    async def source() -> AsyncGenerator[int, None]:
        for i in range(3):
            fetched.append(i)
            yield i

    async def main() -> list[tuple[int, list[int]]]:
        seen = []
        async for item in read_ahead(source()):
            await asyncio.sleep(0)  # the caller is busy: the fetch task runs meanwhile
            seen.append((item, list(fetched)))
        return seen

    seen = asyncio.run(main())
    assert [s[0] for s in seen] == [0, 1, 2]
    assert seen[0][1] == [0, 1]  # item 1 was fetched before the caller was done with item 0
    assert seen[1][1] == [0, 1, 2]


def test_a_source_error_arrives_after_the_items_before_it() -> None:
    async def source() -> AsyncGenerator[int, None]:
        yield 1
        raise ValueError("damaged")

    got: list[int] = []

    async def main() -> None:
        async for item in read_ahead(source()):
            got.append(item)

    with pytest.raises(ValueError, match="damaged"):
        asyncio.run(main())
    assert got == [1]


def test_closing_early_cancels_the_fetch_and_closes_the_source() -> None:
    closed: list[str] = []

    async def source() -> AsyncGenerator[int, None]:
        try:
            yield 1
            await asyncio.sleep(3600)  # the fetch of item 2 never ends by itself
            yield 2
        except asyncio.CancelledError:
            closed.append("cancelled")
            raise
        finally:
            closed.append("closed")

    async def main() -> None:
        it = read_ahead(source())
        assert await anext(it) == 1
        await asyncio.sleep(0.01)  # the fetch of item 2 is under way
        await asyncio.wait_for(it.aclose(), 5)  # type: ignore[attr-defined]

    asyncio.run(main())
    assert closed == ["cancelled", "closed"]
