"""BatchReadBlobs' zstd answers (``kura.grpc.zstd_stream.whole_compressed_off_loop``): a
blob of up to 4 MiB is compressed in a worker thread past 256 KiB, so the event loop (every
other call of the node) keeps running meanwhile; a small one is compressed in place."""

from __future__ import annotations

import asyncio

import zstandard

from kura.grpc.zstd_stream import OFF_LOOP_BYTES, whole_compressed_off_loop

TEXT = b"def rule(ctx):\n    return [DefaultInfo(files = depset(ctx.files.srcs))]\n"


async def ticks_during(data: bytes) -> tuple[int, bytes]:
    """How many times another task ran on the loop while ``data`` was compressed."""
    ticks = 0
    done = False

    async def ticker() -> None:
        nonlocal ticks
        while not done:
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)  # the ticker starts
    before = ticks
    frame = await whole_compressed_off_loop(data)
    during = ticks - before
    done = True
    await task
    return during, frame


def test_a_large_blob_is_compressed_off_the_event_loop() -> None:
    large = TEXT * (4 * 1024 * 1024 // len(TEXT))
    during, frame = asyncio.run(ticks_during(large))
    assert during >= 1  # the loop ran other tasks: 0 when the compression held it
    assert zstandard.ZstdDecompressor().decompress(frame) == large
    small = TEXT * (OFF_LOOP_BYTES // len(TEXT) // 2)
    during, frame = asyncio.run(ticks_during(small))
    assert during == 0  # no thread hop for a small one
    assert zstandard.ZstdDecompressor().decompress(frame) == small
