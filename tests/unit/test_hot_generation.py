"""The shared change counter (``storage.hot_generation``) and a worker's hot cache following it.

The counter is mapped by a real second process (``python -c``), as a worker maps it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kura.core.manifest import Manifest
from kura.storage.hot_generation import SharedGeneration
from kura.storage.hotcache import HotCache


def manifest(aid: str, size: int) -> Manifest:
    return Manifest(
        artifact_id=aid,
        producer="test",
        namespace_id="default",
        key=aid,
        content_type="application/octet-stream",
        size=size,
        sha256="0" * 64,
        created_at_ms=1,
        version_ms=1,
    )


def read_in_another_process(data_dir: Path) -> int:
    code = (
        "import sys; from pathlib import Path;"
        "from kura.storage.hot_generation import SharedGeneration;"
        "print(SharedGeneration.open(Path(sys.argv[1])).value)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(data_dir)], check=True, capture_output=True, text=True
    )
    return int(out.stdout)


def test_a_bump_is_seen_by_another_process(tmp_path: Path) -> None:
    primary = SharedGeneration.create(tmp_path)
    start = primary.value
    assert read_in_another_process(tmp_path) == start
    for _ in range(3):
        primary.bump()
    assert read_in_another_process(tmp_path) == start + 3


def test_a_worker_cannot_open_it_before_the_primary_created_it(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        SharedGeneration.open(tmp_path)


def test_a_workers_mapping_cannot_write(tmp_path: Path) -> None:
    SharedGeneration.create(tmp_path)
    with pytest.raises(TypeError):
        SharedGeneration.open(tmp_path).bump()


@pytest.fixture
def pair(tmp_path: Path) -> tuple[HotCache, HotCache]:
    """A primary's cache and a worker's, sharing one counter."""
    primary, worker = HotCache(1 << 20, 4096), HotCache(1 << 20, 4096)
    primary.share(SharedGeneration.create(tmp_path), follow=False)
    worker.share(SharedGeneration.open(tmp_path), follow=True)
    return primary, worker


def test_a_replacement_in_the_primary_empties_the_workers_cache(
    pair: tuple[HotCache, HotCache],
) -> None:
    primary, worker = pair
    worker.put(manifest("a", 3), b"old", worker.generation)
    assert worker.get("a") == (manifest("a", 3), b"old")
    primary.invalidate(["a"])  # the primary committed a new version of "a"
    assert worker.get("a") is None
    assert worker.size_bytes == 0


def test_bytes_read_across_a_replacement_are_not_kept(pair: tuple[HotCache, HotCache]) -> None:
    primary, worker = pair
    before = worker.generation  # read before the row
    primary.invalidate(["b"])  # ... the primary replaced it meanwhile
    worker.put(manifest("b", 3), b"old", before)
    assert worker.get("b") is None


def test_a_first_write_leaves_the_workers_cache_alone(pair: tuple[HotCache, HotCache]) -> None:
    primary, worker = pair
    worker.put(manifest("a", 3), b"abc", worker.generation)
    primary.invalidate(["new"], replaced=False)  # nobody held "new": it had no row
    assert worker.get("a") == (manifest("a", 3), b"abc")
