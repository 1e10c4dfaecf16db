"""Storage guarantees seen from outside, against real node processes (storage.service,
storage.blobs): stored bytes are verified before they are served, the disk budget holds by
least-recently-used eviction, data survives restarts, a crash leaves nothing that the next start
does not sweep, one data directory has one owner, and streamed bodies are staged within the tmp
budget.
"""

from __future__ import annotations

import hashlib
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests import oneshot
from tests.conftest import NodeProcess, serve_refused, spawn_node
from tests.e2e.mesh import wait_for
from tests.integration import rawhttp

pytestmark = pytest.mark.in_process

KiB = 1024
MiB = 1024 * KiB
SMALL_BLOB_BYTES = 64 * KiB  # storage.service: at or below this, verified on every read
READ_CORRUPT = 'kura_storage_corrupt_artifacts_total{detected_by="read"}'


def blob_file(node: NodeProcess, before: list[Path]) -> Path:
    """The one blob file that appeared since ``before``."""
    new = [p for p in node.blob_files() if p not in before]
    assert len(new) == 1, new
    return new[0]


def flip_byte(path: Path, offset: int) -> None:
    with path.open("r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))


def next_millisecond() -> None:
    """Return once the wall clock shows a later millisecond (LRU order is by access ms)."""
    start = time.time_ns() // 1_000_000
    while time.time_ns() // 1_000_000 <= start + 1:
        time.sleep(0.001)


# -- corruption -------------------------------------------------------------------------------


def test_corrupted_small_blob_reads_as_a_miss_and_is_dropped(
    start_node: Callable[..., NodeProcess],
) -> None:
    # Every read goes to disk (the hot cache: below), and the body is a file, not inline.
    node = start_node(hot_cache_bytes=0, inline_max_bytes=0)
    body = os.urandom(10 * KiB)
    with node.client() as c:
        assert c.put("/cache/small/one", content=body).status_code == 201
        assert c.put("/cache/small/two", content=b"neighbour").status_code == 201
        before = node.blob_files()
        assert c.put("/cache/small/victim", content=body).status_code == 201
        path = blob_file(node, before)
        assert c.get("/cache/small/victim").content == body
        flip_byte(path, 5000)
        r = c.get("/cache/small/victim")
        assert r.status_code == 404
        assert node.metric(READ_CORRUPT) == 1
        assert node.index_rows() == 2
        assert not path.exists()
        assert node.metric("kura_disk_used_bytes") == len(body) + len(b"neighbour")
        assert c.get("/cache/small/victim").status_code == 404  # stays a miss
        assert node.metric(READ_CORRUPT) == 1
        assert c.get("/cache/small/one").content == body  # neighbours untouched
        # The key can be stored again.
        assert c.put("/cache/small/victim", content=body).status_code == 201
        assert c.get("/cache/small/victim").content == body


def test_a_hot_cached_blob_never_serves_bytes_corrupted_on_disk_and_a_restart_drops_it(
    start_node: Callable[..., NodeProcess],
) -> None:
    node = start_node(inline_max_bytes=0)  # a file, to damage on disk
    body = os.urandom(10 * KiB)
    with node.client() as c:
        assert c.put("/cache/hot/victim", content=body).status_code == 201
        (path,) = node.blob_files()
        assert c.get("/cache/hot/victim").content == body  # verified, now held in memory
        flip_byte(path, 5000)
        # Served from memory: the bytes verified when they entered the cache, never the flip.
        assert c.get("/cache/hot/victim").content == body
    assert node.metric('kura_hot_cache_lookups_total{result="hit"}') >= 1
    node.stop()
    node = spawn_node(node.log_path.parent, node.env)  # empty cache: the disk is read again
    try:
        with node.client() as c:
            assert c.get("/cache/hot/victim").status_code == 404
        assert node.metric(READ_CORRUPT) == 1
        assert node.index_rows() == 0
    finally:
        node.stop()


def test_a_write_replaces_the_hot_cached_copy_at_once(node: NodeProcess) -> None:
    with node.client() as c:
        for i in range(50):
            body = f"version {i}".encode()
            assert c.put("/cache/hot/key", content=body).status_code in (200, 201)
            assert c.get("/cache/hot/key").content == body


def test_corrupted_large_blob_is_rehashed_when_its_ctime_changes(
    start_node: Callable[..., NodeProcess],
) -> None:
    """KURA_VERIFY_READS=changed: a large blob is re-hashed (before sending) when its stat
    signature changed. (The default, ``always``, is covered in test_integrity.py.)"""
    node = start_node(verify_reads="changed")
    body = os.urandom(SMALL_BLOB_BYTES + 300 * KiB)
    with node.client() as c:
        assert c.put("/api/metro/cache/big", content=body).status_code == 200
        (path,) = node.blob_files()
        assert c.get("/api/metro/cache/big").content == body  # verified once, stat recorded
        st = path.stat()
        # Large blobs are re-hashed only when the file's stat signature changes, so the flip
        # must land on a later ctime tick (coarse kernel clocks tick every few ms).
        while time.time_ns() < st.st_ctime_ns + 20_000_000:
            time.sleep(0.005)
        flip_byte(path, len(body) - 10)
        after = path.stat()
        assert (after.st_size, after.st_ino) == (st.st_size, st.st_ino)
        assert after.st_ctime_ns != st.st_ctime_ns
        r = c.get("/api/metro/cache/big")
        assert r.status_code == 404
    assert node.metric(READ_CORRUPT) == 1
    assert node.index_rows() == 0
    assert node.blob_files() == []
    assert node.metric("kura_disk_used_bytes") == 0
    assert len(list((node.data_dir / "quarantine").glob("*.json"))) == 1


def test_a_blob_file_deleted_behind_the_nodes_back_reads_as_a_miss(
    start_node: Callable[..., NodeProcess],
) -> None:
    node = start_node(inline_max_bytes=0)  # a file, to delete
    with node.client() as c:
        assert c.put("/cache/gone", content=b"x" * 100).status_code == 201
        (path,) = node.blob_files()
        path.unlink()
        assert c.get("/cache/gone").status_code == 404
    assert node.index_rows() == 0
    assert node.metric("kura_disk_used_bytes") == 0


# -- eviction ---------------------------------------------------------------------------------


def test_lru_eviction_keeps_disk_under_the_limit_and_the_recently_read_artifact(
    start_node: Callable[..., NodeProcess],
) -> None:
    limit = 1 * MiB
    node = start_node(max_disk_bytes=limit, workers=2)  # a worker reports its hits below
    size = 200 * KiB
    bodies = {name: os.urandom(size) for name in "abcdefgh"}

    def used() -> float:
        return node.metric("kura_disk_used_bytes")

    with node.client() as c:
        for name in "abcde":  # 1000 KiB: fits
            assert c.put(f"/cache/lru/{name}", content=bodies[name]).status_code == 201
            next_millisecond()
        assert node.metric("kura_storage_evictions_total") == 0
        assert c.get("/cache/lru/a").content == bodies["a"]  # a is now the most recent
        # A read served by a worker reaches the primary's LRU when the worker reports its hits
        # (about every second; none are left to report with one process).
        assert wait_for(lambda: node.metric("kura_worker_unreported_hits") == 0, 10)
        next_millisecond()
        for name in "fgh":
            assert c.put(f"/cache/lru/{name}", content=bodies[name]).status_code == 201
            assert used() <= limit
            assert sum(p.stat().st_size for p in node.blob_files()) <= limit
            next_millisecond()
        present = {n for n in bodies if c.get(f"/cache/lru/{n}").status_code == 200}
    assert "a" in present  # read recently: survives although written first
    assert {"f", "g", "h"} <= present  # just written
    assert {"b", "c"}.isdisjoint(present)  # the least recently used went first
    evicted = len(bodies) - len(present)
    assert node.metric("kura_storage_evictions_total") == evicted
    assert node.metric("kura_storage_evicted_bytes_total") == evicted * size
    assert node.index_rows() == len(present) == len(node.blob_files())
    assert used() == len(present) * size <= limit


# -- restarts ---------------------------------------------------------------------------------


def _store_one_of_each(c: httpx.Client) -> dict[str, bytes]:
    large = os.urandom(300 * KiB)
    q = "tenant_id=t&namespace_id=n"
    assert c.put("/cache/keep/plain", content=b"plain").status_code == 201
    assert c.put("/v1/cache/9001", content=large).status_code == 200
    assert c.put(f"/api/cache/gradle/g1?{q}", content=b"gradle").status_code == 201
    kv = {"cas_id": "kv", "entries": [{"value": "v"}]}
    assert c.put(f"/api/cache/keyvalue?{q}", json=kv).status_code == 204
    r = c.put("/v8/artifacts/t1?slug=team", content=b"turbo", headers={"x-artifact-tag": "tg"})
    assert r.status_code == 202
    return {
        "/cache/keep/plain": b"plain",
        "/v1/cache/9001": large,
        f"/api/cache/gradle/g1?{q}": b"gradle",
        f"/api/cache/keyvalue/kv?{q}": b'{"entries":[{"value":"v"}]}',
        "/v8/artifacts/t1?slug=team": b"turbo",
    }


def test_data_survives_a_sigterm_restart(start_node: Callable[..., NodeProcess]) -> None:
    first = start_node()
    with first.client() as c:
        stored = _store_one_of_each(c)
    rows, used = first.index_rows(), first.metric("kura_disk_used_bytes")
    assert first.stop(signal.SIGTERM) == 0
    second = start_node()  # same name: same data and tmp dirs
    assert second.data_dir == first.data_dir
    with second.client() as c:
        for path, body in stored.items():
            r = c.get(path)
            assert (r.status_code, r.content) == (200, body), path
        assert c.get("/v8/artifacts/t1?slug=team").headers["x-artifact-tag"] == "tg"
    assert second.index_rows() == rows
    assert second.metric("kura_disk_used_bytes") == used
    assert second.metric("kura_storage_artifacts") == rows


def test_restart_after_sigkill_sweeps_staging_leftovers_and_orphans(
    start_node: Callable[..., NodeProcess],
) -> None:
    first = start_node(process=True)  # killed below
    keep, lose = os.urandom(100 * KiB), os.urandom(100 * KiB)
    with first.client() as c:
        assert c.put("/cache/crash/keep", content=keep).status_code == 201
        before = first.blob_files()
        assert c.put("/cache/crash/lose", content=lose).status_code == 201
        lose_file = blob_file(first, before)
    # A body in flight when the process dies leaves its staging file behind.
    sock = rawhttp.connect(first.url)
    rawhttp.send_head(sock, "PUT", "/cache/crash/inflight", {"Content-Length": str(MiB)})
    sock.sendall(b"i" * 1000)
    assert rawhttp.wait_until(lambda: len(first.staging_files()) == 1)
    assert first.stop(signal.SIGKILL) == -signal.SIGKILL
    sock.close()

    tmp, blobs = first.tmp_dir, first.data_dir / "blobs"
    leftovers = [
        tmp / "uploads" / "upload-leftover",
        tmp / "parts" / "part-leftover",
        tmp / "bootstrap" / "bootstrap-leftover",
        blobs / "multipart.incoming-leftover",
        blobs / "ab" / "cd" / ("ab" + "cd" + "0" * 60 + ".incoming-x"),
    ]
    orphan = blobs / "ee" / "ff" / ("eeff" + "1" * 60)  # a blob file with no index row
    for path in [*leftovers, orphan]:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"junk" * 1000)
    lose_file.unlink()  # an index row whose blob file is gone
    assert len(first.staging_files()) == 4  # three leftovers plus the in-flight body

    second = start_node()
    assert second.staging_files() == []
    assert not any(p.exists() for p in leftovers)
    assert not orphan.exists()
    assert second.index_rows() == 1
    assert second.blob_files() == [p for p in before if p.exists()]
    assert second.metric("kura_disk_used_bytes") == len(keep)
    assert second.metric("kura_storage_artifacts") == 1
    with second.client() as c:
        assert c.get("/cache/crash/keep").content == keep
        assert c.get("/cache/crash/lose").status_code == 404
        assert c.get("/cache/crash/inflight").status_code == 404
    assert second.metric_sum("kura_storage_corrupt_artifacts_total") == 0  # swept, not "corrupt"
    assert "start-up sweep removed" in second.log()


def test_a_second_process_on_the_same_data_dir_exits_1_and_touches_nothing(
    start_node: Callable[..., NodeProcess], tmp_path: Path
) -> None:
    # The running node has a body in flight: its staging file must survive the intruder.
    node = start_node(inline_max_bytes=0)  # so the small body is staged in the tmp dir
    sock = rawhttp.connect(node.url)
    rawhttp.send_head(sock, "PUT", "/cache/owner/inflight", {"Content-Length": "2000"})
    sock.sendall(b"o" * 1000)
    assert rawhttp.wait_until(lambda: len(node.staging_files()) == 1)
    staged = node.staging_files()
    env = dict(node.env)
    stderr = serve_refused(env, cwd=tmp_path, exit_code=1)
    assert f"data directory {node.data_dir} is in use by another kura process" in stderr
    assert node.staging_files() == staged
    with sock:
        sock.sendall(b"o" * 1000)
        status, _h, _b = rawhttp.read_response(sock)
    assert status == 201
    with node.client() as c:
        assert c.get("/cache/owner/inflight").content == b"o" * 2000


def test_the_data_dir_is_free_again_once_its_owner_exits(
    start_node: Callable[..., NodeProcess], tmp_path: Path
) -> None:
    node = start_node(process=True)
    assert node.stop(signal.SIGKILL) == -signal.SIGKILL  # even after a crash: flock dies too
    again = spawn_node(tmp_path / "again", dict(node.env))
    try:
        assert oneshot.get(again.url + "/up", timeout=10).status_code == 200
    finally:
        assert again.stop() == 0


# -- streamed bodies and the tmp budget -------------------------------------------------------


def _put_chunked(
    node: NodeProcess, path: str, body: bytes, method: str = "PUT"
) -> tuple[int, bytes]:
    sock = rawhttp.connect(node.url)
    with sock:
        rawhttp.send_head(sock, method, path, {"Transfer-Encoding": "chunked"})
        try:
            for i in range(0, len(body), 64 * KiB):
                sock.sendall(rawhttp.chunk(body[i : i + 64 * KiB]))
            sock.sendall(rawhttp.LAST_CHUNK)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may answer and close before reading everything
        status, _headers, answer = rawhttp.read_response(sock)
    return status, answer


def test_a_chunked_body_that_fits_the_tmp_budget_is_stored_whatever_the_growth_step(
    start_node: Callable[..., NodeProcess],
) -> None:
    # Bodies without Content-Length reserve in 1 MiB steps; a step past the capacity must not
    # turn a body that fits into a 503 that no retry can cure.
    node = start_node(tmp_dir_max_bytes=1536 * KiB)
    for path in ("/cache/chunked/fits", "/api/metro/cache/fits", "/v1/cache/1234"):
        body = os.urandom(1200 * KiB)
        status, answer = _put_chunked(node, path, body)
        assert status in (200, 201), (path, status, answer)
        with node.client() as c:
            r = c.get(path)
            assert hashlib.sha256(r.content).hexdigest() == hashlib.sha256(body).hexdigest()
    assert node.metric("kura_tmp_reserved_bytes") == 0


def test_a_chunked_body_larger_than_the_whole_tmp_budget_is_413_not_503(
    start_node: Callable[..., NodeProcess],
) -> None:
    node = start_node(tmp_dir_max_bytes=1536 * KiB)
    rows = node.index_rows()
    status, answer = _put_chunked(node, "/cache/chunked/toolarge", os.urandom(2 * MiB))
    assert status == 413, answer
    assert b"tmp staging budget" in answer
    assert rawhttp.wait_until(lambda: node.staging_files() == [])
    assert node.metric("kura_tmp_reserved_bytes") == 0
    assert node.index_rows() == rows


def test_a_chunked_multipart_part_fits_a_tmp_budget_smaller_than_the_part_limit(
    start_node: Callable[..., NodeProcess],
) -> None:
    node = start_node(tmp_dir_max_bytes=4 * MiB)
    q = "tenant_id=t&hash=h&name=n"
    with node.client() as c:
        upload_id = c.post(f"/api/cache/module/start?{q}").json()["upload_id"]
    part = os.urandom(100 * KiB)
    status, answer = _put_chunked(
        node, f"/api/cache/module/part?upload_id={upload_id}&part_number=1", part, "POST"
    )
    assert status == 204, answer
    with node.client() as c:
        r = c.post(f"/api/cache/module/complete?upload_id={upload_id}", json={"parts": [1]})
        assert r.status_code == 204
        assert c.get(f"/api/cache/module/x?{q}").content == part
