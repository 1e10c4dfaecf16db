"""A node in-process (kura.app.Node, kura.storage.service): failures of background tasks and the
outbox gauge (issue 10, deliverable 8).

* A background task that fails stops the node with a clear error, and storage is still closed:
  the data-dir lock is released and a new node opens the same data dir at once and serves every
  acknowledged write.
* ``StorageStats.outbox_depth`` is changed on the writer thread only, and after many concurrent
  writes and acknowledgements it equals the outbox's real row count.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kit.clock import SystemClock
from kit.settings import load
from kura.app import Node
from kura.cli import build_parser
from kura.settings import Settings, validate_settings
from kura.storage.budget import TmpBudget
from kura.storage.service import ArtifactRef, CacheService, StorageStats

MiB = 1024 * 1024


def _settings(root: Path) -> Settings:
    env = {
        "KURA_PORT": "0",
        "KURA_INTERNAL_PORT": "0",
        "KURA_DATA_DIR": str(root / "data"),
        "KURA_TMP_DIR": str(root / "tmp"),
        "KURA_MIN_FREE_DISK_BYTES": "0",
    }
    return load(Settings, build_parser().parse_args(["serve"]), env, validate=validate_settings)


async def test_a_failed_background_task_stops_the_node_and_still_closes_storage(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = _settings(tmp_path)
    node = Node(settings)
    fail = asyncio.Event()

    async def failing_bootstrap() -> None:
        """Fault injection: the real bootstrapper replaced by a task that raises on demand."""
        await fail.wait()
        raise RuntimeError("injected background failure")

    node.bootstrapper.run = failing_bootstrap  # type: ignore[method-assign]
    started = asyncio.Event()
    real_start = node.start

    async def start() -> None:
        await real_start()
        started.set()

    node.start = start  # type: ignore[method-assign]
    serving = asyncio.create_task(node.serve_forever())
    async with asyncio.timeout(30):
        await started.wait()
    bodies = {f"{i:04x}": f"artifact {i}".encode() * 100 for i in range(50)}
    async with aiohttp.ClientSession(node.public_url) as http:
        for key, body in bodies.items():
            async with http.put(f"/v1/cache/{key}", data=body) as r:
                assert r.status == 200, await r.text()
    with caplog.at_level(logging.ERROR, logger="kura.app"):
        fail.set()
        with pytest.raises(RuntimeError, match="background task stopped unexpectedly"):
            async with asyncio.timeout(60):
                await serving
    failures = [r for r in caplog.records if r.getMessage() == "background task failed"]
    assert len(failures) == 1, "the failure is logged once, with its traceback"
    assert "injected background failure" in repr(failures[0].exc_info)

    again = Node(settings)
    await again.start()  # raises DataDirLocked if the first node kept its lock
    try:
        assert again.service.stats.artifacts == len(bodies)
        for key, body in bodies.items():
            stored = await again.service.reads.read(ArtifactRef("nx", "nx", key))
            assert stored.data == body, key
    finally:
        await again.stop()


class ThreadRecordingStats(StorageStats):
    """StorageStats that records which thread changes ``outbox_depth`` (an observer, not a
    double: the service uses it exactly like the real one)."""

    def __init__(self) -> None:
        super().__init__()
        self.outbox_threads: set[str] = set()

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "outbox_depth" and hasattr(self, "outbox_threads"):
            self.outbox_threads.add(threading.current_thread().name)
        super().__setattr__(name, value)


@pytest.fixture
def fine_thread_switching() -> Iterator[None]:
    """Switch threads far more often than the default 5 ms, so lost updates would show."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


@pytest.mark.usefixtures("fine_thread_switching")
async def test_outbox_depth_is_changed_on_the_writer_thread_and_matches_the_rows(
    tmp_path: Path,
) -> None:
    peers = ("http://127.0.0.1:1", "http://127.0.0.1:2")
    service = CacheService(
        data_dir=tmp_path / "data",
        tmp_dir=tmp_path / "tmp",
        tenant_id="t",
        budget=TmpBudget(64 * MiB, tmp_dir=tmp_path / "tmp"),
        clock=SystemClock(),
        max_disk_bytes=1024 * MiB,
        min_free_disk_bytes=0,
        targets=lambda: peers,  # local writes are enqueued for them
    )
    stats = service.stats = ThreadRecordingStats()
    await service.start()
    writes_done = asyncio.Event()
    acked = 0

    async def write(i: int) -> None:
        data = hashlib.sha256(str(i).encode()).digest()
        await service.put_inline(ArtifactRef("xcode", "ns", f"k{i}"), data, "application/json")

    async def ack(peer: str) -> None:
        nonlocal acked
        while True:
            batch = await service.replica_log.outbox_batch(peer, 7)
            if batch:
                await service.replica_log.outbox_ack([m.id for m in batch])
                acked += len(batch)
            elif writes_done.is_set():
                return
            else:
                await asyncio.sleep(0)

    try:
        ackers = [asyncio.create_task(ack(p)) for p in peers]
        await asyncio.gather(*(write(i) for i in range(600)))
        writes_done.set()
        await asyncio.gather(*ackers)
        for i in range(100):  # more writes left unacknowledged
            await write(1000 + i)
        rows = sum(n for n, _ in (await service.replica_log.outbox_depths()).values())
        assert acked == 1200
        assert rows == 200
        assert stats.outbox_depth == rows
        assert {name.split("_")[0] for name in stats.outbox_threads} == {"kura-write"}, (
            stats.outbox_threads
        )
    finally:
        await service.close()
