"""``storage.offload``: a staged body created, written and hashed in a thread pool
(``stage_body(offload=...)``) holds exactly the bytes that arrived, and a stage cancelled at any
point, the creation of its file included, leaves no file behind (real files, real threads)."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import os
import tempfile
import threading
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kura.storage.blobs import stage_body
from kura.storage.budget import TmpBudget
from kura.storage.offload import OFFLOAD_BLOCK_BYTES, open_for_writing

MiB = 1024 * 1024


async def _chunks(parts: list[bytes], pause: asyncio.Event | None = None) -> AsyncIterator[bytes]:
    for p in parts:
        yield p
    if pause is not None:
        await pause.wait()  # the body stalls here until the test cancels the stage


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    at = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(at)] or [b""]


@settings(max_examples=20, deadline=None)
@given(
    size=st.integers(0, 3 * OFFLOAD_BLOCK_BYTES + 5),
    cuts=st.lists(st.integers(0, 3 * OFFLOAD_BLOCK_BYTES + 5), max_size=5),
    offloaded=st.booleans(),
)
def test_a_stage_writes_and_hashes_exactly_the_bytes_that_arrived(
    size: int, cuts: list[int], offloaded: bool
) -> None:
    """In the pool (each block written, its writeback started, then hashed) or on the loop,
    with chunks of any sizes mixed in any order."""
    data = os.urandom(size)

    async def run(path: Path, pool: ThreadPoolExecutor) -> str:
        with TmpBudget(4 * OFFLOAD_BLOCK_BYTES).try_reserve(max(1, size)) as reservation:
            staged = await stage_body(
                _chunks(_split(data, cuts)),
                path,
                reservation,
                limit_bytes=size,
                declared_length=size,
                offload=pool if offloaded else None,
            )
        return staged.sha256

    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(1) as pool:
        path = Path(tmp) / "staged"
        assert asyncio.run(run(path, pool)) == hashlib.sha256(data).hexdigest()
        assert path.read_bytes() == data


def test_a_stage_cancelled_while_its_file_is_being_created_leaves_no_file(
    tmp_path: Path,
) -> None:
    """The pool's one thread is busy, so the open waits in its queue; the stage is cancelled
    then, and the open runs afterwards: the file it creates is closed and removed."""
    path = tmp_path / "staged"
    busy = threading.Event()

    async def run(pool: ThreadPoolExecutor) -> None:
        pool.submit(busy.wait, 10)
        task = asyncio.create_task(open_for_writing(path, pool))
        await asyncio.sleep(0.05)
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        busy.set()
        for _ in range(200):  # the open completes in the thread, then its cleanup on the loop
            await asyncio.sleep(0.01)
            if not path.exists() and pool._work_queue.empty():
                break

    with ThreadPoolExecutor(1) as pool:
        asyncio.run(run(pool))
    assert not path.exists()
    assert list(tmp_path.iterdir()) == []


def test_an_offloaded_stage_cancelled_mid_body_leaves_no_file(tmp_path: Path) -> None:
    path = tmp_path / "staged"
    size = 3 * MiB

    async def run(pool: ThreadPoolExecutor) -> None:
        pause = asyncio.Event()
        with TmpBudget(8 * MiB).try_reserve(size) as reservation:
            task = asyncio.create_task(
                stage_body(
                    _chunks([os.urandom(MiB), os.urandom(MiB)], pause),
                    path,
                    reservation,
                    limit_bytes=size,
                    declared_length=size,
                    offload=pool,
                )
            )
            for _ in range(200):
                await asyncio.sleep(0.01)
                if path.exists() and path.stat().st_size >= MiB:
                    break
            assert path.exists()  # it was writing
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    with ThreadPoolExecutor(1) as pool:
        asyncio.run(run(pool))
    assert list(tmp_path.iterdir()) == []
