"""A cancelled caller never goes on while its thread's call still runs (``kit.thread_calls``),
so a Read cancelled mid-blob closes its file only once no thread reads it
(``kura.api.file_response.verified_frames`` under ``kit.read_ahead``)."""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kit.read_ahead import read_ahead
from kit.thread_calls import finished_in_thread
from kura.api.file_response import verified_frames
from kura.core.manifest import Manifest
from kura.storage.artifact import StoredBody


def test_a_cancelled_caller_waits_for_its_threads_call_to_end() -> None:
    started, ended = threading.Event(), threading.Event()

    def slow() -> int:
        started.set()
        time.sleep(0.3)
        ended.set()
        return 1

    async def main() -> None:
        task = asyncio.ensure_future(finished_in_thread(asyncio.to_thread(slow)))
        await asyncio.to_thread(started.wait, 10)  # the call is running on its thread
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert ended.is_set(), "the caller went on while its thread's call still ran"

    asyncio.run(main())


def test_a_read_closed_mid_blob_leaves_no_thread_reading_its_file(tmp_path: Path) -> None:
    data = bytes(range(256)) * 4096 * 3  # 3 MiB: three 1 MiB chunks
    path = tmp_path / "blob"
    path.write_bytes(data)
    framing: list[str] = []
    second = threading.Event()

    def slow_frame(chunk: bytes) -> bytes:  # runs on the verifier thread, as read_response does
        framing.append("start")
        if len(framing) > 2:
            second.set()
        time.sleep(0.2)
        framing.append("end")
        return chunk

    manifest = Manifest(
        "a", "bazel", "", "k", "application/octet-stream", len(data),
        hashlib.sha256(data).hexdigest(), 1, 1,
    )  # fmt: skip
    with ThreadPoolExecutor(2) as pool:
        service: Any = SimpleNamespace(verifier=SimpleNamespace(pool=pool))

        async def main() -> None:
            with path.open("rb") as f:
                body = StoredBody(manifest, file=f, verified=False)
                frames = read_ahead(verified_frames(service, body, slow_frame, 1024 * 1024))
                first, size = await anext(frames)
                assert size == len(first) == 1024 * 1024
                await asyncio.to_thread(second.wait, 10)  # the next chunk is being framed
                await frames.aclose()  # type: ignore[attr-defined]
                assert framing[-1] == "end", framing  # nothing runs on the file from here

        asyncio.run(main())
