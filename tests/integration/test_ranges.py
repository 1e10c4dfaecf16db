"""HTTP Range on artifact GETs against real node processes (api.partial_content, RFC 9110 §14):
206 with exactly the asked bytes on every public route that serves a stored body, 416 for a
range past the end, the full 200 for ranges kura ignores, HEAD like GET, and a damaged blob
never served inside a 206 (a byte flipped below the filesystem, stat signature unchanged)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import xxhash

from tests import oneshot
from tests.conftest import NodeProcess
from tests.e2e.mesh import wait_for
from tests.integration.ext4 import Ext4Image
from tests.integration.test_fast_checksum import blob_of, checksums, flip_below, to_schema_1
from tests.integration.test_integrity import (
    corrupt,
    ext4,  # noqa: F401  (the fixture)
    quarantined,
    spawn_on,
    store_and_corrupt_below,
)
from tests.integration.test_workers import worker_pids

pytestmark = pytest.mark.in_process

KiB = 1024
MiB = 1024 * KiB
SCOPE = "tenant_id=acme&namespace_id=app"

# (route, how to store) for every public route that GETs a stored body through blob.serve.
ROUTES = {
    "http_cache": ("/cache/r/blob", "PUT"),
    "nx": ("/v1/cache/123456", "PUT"),
    "turbo": ("/v8/artifacts/abc123?slug=team", "PUT"),
    "gradle": (f"/api/cache/gradle/k1?{SCOPE}", "PUT"),
    "metro": ("/api/metro/cache/m1", "PUT"),
    "xcode": (f"/api/cache/cas/obj1?{SCOPE}", "POST"),
    "webdav": ("/dav/r/blob", "PUT"),
}


def _stored(node: NodeProcess, route: str, body: bytes) -> str:
    path, method = ROUTES[route]
    if route == "xcode":
        path = path.replace("obj1", "obj" + hashlib.sha256(body).hexdigest()[:8])
    with node.client() as c:
        tag = {"x-artifact-tag": "sig1"} if route == "turbo" else {}
        r = c.request(method, path, content=body, headers=tag)
        assert r.status_code < 300, r.text
    return path


def _cases(size: int) -> list[tuple[str, int, int]]:
    """(Range value, first, last) for start, middle, suffix, open-ended, clamped, whole."""
    return [
        ("bytes=0-99", 0, 99),
        (f"bytes={size // 2}-{size // 2 + 4095}", size // 2, size // 2 + 4095),
        ("bytes=-500", size - 500, size - 1),
        (f"bytes={size - 1000}-", size - 1000, size - 1),
        (f"bytes=7-{size * 10}", 7, size - 1),
        ("bytes=0-", 0, size - 1),
        (f"bytes=-{size * 3}", 0, size - 1),
        ("BYTES=3-3", 3, 3),
    ]


@pytest.mark.parametrize("size", [3 * MiB + 17, 10 * KiB + 3], ids=["file", "memory"])
def test_a_single_range_gets_206_with_exactly_those_bytes_on_every_route(
    node: NodeProcess, size: int
) -> None:
    for route in sorted(ROUTES):
        _check_ranges(node, route, size)


def _check_ranges(node: NodeProcess, route: str, size: int) -> None:
    body = os.urandom(size)
    path = _stored(node, route, body)
    etag = f'"{hashlib.sha256(body).hexdigest()}"'
    with node.client() as c:
        full = c.get(path)
        assert full.status_code == 200, route
        assert full.content == body
        assert full.headers["Accept-Ranges"] == "bytes"
        assert full.headers["ETag"] == etag
        for value, first, last in _cases(size):
            r = c.get(path, headers={"Range": value})
            assert r.status_code == 206, (route, value, r.status_code, r.text[:200])
            assert r.headers["Content-Range"] == f"bytes {first}-{last}/{size}", value
            assert int(r.headers["Content-Length"]) == last - first + 1
            assert r.content == body[first : last + 1], (route, value)
            assert r.headers["ETag"] == etag
            assert r.headers["Accept-Ranges"] == "bytes"
            if route == "turbo":  # turbo treats a signed artifact without its tag as a miss
                assert r.headers["x-artifact-tag"] == "sig1"
            # HEAD answers like GET, without a body.
            h = c.head(path, headers={"Range": value})
            assert h.status_code == 206
            assert h.headers["Content-Range"] == r.headers["Content-Range"]
            assert h.headers["Content-Length"] == r.headers["Content-Length"]
            assert h.content == b""
        # A resume that names the version it has (If-Range with the ETag) gets the rest.
        r = c.get(path, headers={"Range": "bytes=100-", "If-Range": etag})
        assert r.status_code == 206, route
        assert r.content == body[100:]


def test_the_bazel_cas_and_action_cache_routes_honour_range(node: NodeProcess) -> None:
    blob = os.urandom(200 * KiB)
    digest = hashlib.sha256(blob).hexdigest()
    with node.client() as c:
        assert c.put(f"/cache/cas/{digest}", content=blob).status_code in (200, 201)
        r = c.get(f"/cache/cas/{digest}", headers={"Range": "bytes=1000-1999"})
        assert r.status_code == 206
        assert r.content == blob[1000:2000]
        # An empty ActionResult references nothing: a hit; its stored bytes serve a range too.
        result = b"\x20\x00"  # field 4 (exit_code) = 0
        ac = hashlib.sha256(b"action").hexdigest()
        assert c.put(f"/cache/ac/{ac}", content=result).status_code in (200, 201)
        r = c.get(f"/cache/ac/{ac}", headers={"Range": "bytes=1-"})
        assert r.status_code == 206, r.text
        assert r.content == result[1:]


@pytest.mark.parametrize("size", [3 * MiB, 10 * KiB], ids=["file", "memory"])
def test_a_range_past_the_end_gets_416_with_the_size(node: NodeProcess, size: int) -> None:
    body = os.urandom(size)
    path = _stored(node, "http_cache", body)
    with node.client() as c:
        for value in (f"bytes={size}-", f"bytes={size + 10}-{size + 20}", "bytes=-0"):
            for method in ("GET", "HEAD"):
                r = c.request(method, path, headers={"Range": value})
                assert r.status_code == 416, (value, method)
                assert r.headers["Content-Range"] == f"bytes */{size}"
        # A 416 leaves the entry as it was.
        assert c.get(path).content == body
    assert node.metric_sum("kura_storage_corrupt_artifacts_total") == 0


def test_ranges_kura_ignores_get_the_full_200(node: NodeProcess) -> None:
    body = os.urandom(3 * MiB)
    path = _stored(node, "nx", body)
    etag = f'"{hashlib.sha256(body).hexdigest()}"'
    ignored = [
        {"Range": "bytes=500-100"},  # last-pos below first-pos: invalid
        {"Range": "bytes=abc"},
        {"Range": "bytes=1-2-3"},
        {"Range": "bytes=+1-2"},
        {"Range": "bytes="},
        {"Range": "bytes 0-10"},
        {"Range": "items=0-10"},  # a unit kura does not know
        {"Range": "bytes=0-1,5-6"},  # multi-range: ignored, never multipart
        {"Range": "bytes=0-10", "If-Range": '"other"'},
        {"Range": "bytes=0-10", "If-Range": "W/" + etag},  # weak never matches
        {"Range": "bytes=0-10", "If-Range": "Tue, 01 Dec 2026 10:00:00 GMT"},
    ]
    with node.client() as c:
        for headers in ignored:
            r = c.get(path, headers=headers)
            assert r.status_code == 200, headers
            assert r.content == body, headers
            assert "Content-Range" not in r.headers
        # If-Range without Range is ignored too.
        assert c.get(path, headers={"If-Range": '"x"'}).content == body


def test_a_damaged_blob_is_never_served_inside_a_206(ext4: Ext4Image) -> None:  # noqa: F811
    body = os.urandom(3 * MiB)
    flipped = 2 * MiB + 321
    store_and_corrupt_below(ext4, body, flipped)
    node = spawn_on(ext4, scrub_interval_seconds=0)
    try:
        url = node.url + "/cache/flip/blob"
        ranges = [
            f"bytes={flipped - 10}-{flipped + 10}",  # holds the flipped byte
            "bytes=0-1023",  # intact bytes of a damaged file: not sent either
            "bytes=-4096",
            f"bytes={flipped}-",
        ] * 6

        def status(value: str) -> int | str:
            try:
                return oneshot.get(url, headers={"Range": value}, timeout=30).status_code
            except httpx.TransportError:
                return "aborted"

        with ThreadPoolExecutor(8) as pool:
            seen = list(pool.map(status, ranges))
        assert 206 not in seen, seen
        assert set(seen) == {404}, seen
        assert node.metric(corrupt("read")) == 1
        assert node.index_rows() == 0
        (kept,) = quarantined(node)
        assert len(kept.read_bytes()) == len(body)
        assert "quarantined artifact" in node.log()
    finally:
        assert node.stop() == 0


def test_a_resume_naming_an_overwritten_version_gets_the_new_one_whole(node: NodeProcess) -> None:
    old, new = os.urandom(3 * MiB), os.urandom(3 * MiB)
    path = _stored(node, "http_cache", old)
    with node.client() as c:
        first = c.get(path, headers={"Range": "bytes=0-1023"})
        assert first.status_code == 206
        old_etag = first.headers["ETag"]
        assert c.put(path, content=new).status_code == 200
        r = c.get(path, headers={"Range": "bytes=1024-", "If-Range": old_etag})
        assert r.status_code == 200  # never old bytes spliced onto new ones
        assert r.content == new
        assert r.headers["ETag"] == f'"{hashlib.sha256(new).hexdigest()}"'


def test_a_range_of_a_row_from_before_the_checksum_is_checked_with_sha256(
    ext4: Ext4Image,  # noqa: F811
) -> None:
    intact, damaged = os.urandom(2 * MiB), os.urandom(2 * MiB)
    node = spawn_on(ext4, scrub_interval_seconds=0)
    try:
        with node.client() as c:
            for key, body in (("intact", intact), ("damaged", damaged)):
                assert c.put(f"/cache/old/{key}", content=body).status_code == 201
        path = blob_of(node, damaged)
    finally:
        assert node.stop() == 0
    to_schema_1(node)
    flip_below(ext4, path, MiB + 5)
    node = spawn_on(ext4, scrub_interval_seconds=0, workers=2)  # a worker may find it (below)
    try:
        with node.client() as c:
            r = c.get("/cache/old/damaged", headers={"Range": "bytes=0-99"})
            assert r.status_code == 404
            # A worker that finds it reports it to the primary, which counts it (within ~1 s).
            assert wait_for(lambda: node.metric(corrupt("read")) == 1, 10)
            assert "the file hashes to sha256" in node.log()
            r = c.get("/cache/old/intact", headers={"Range": "bytes=-100"})
            assert r.status_code == 206
            assert r.content == intact[-100:]
        want = xxhash.xxh3_128(intact).hexdigest()  # recorded by the same pass
        assert wait_for(lambda: checksums(node) == {"old/intact": want}, timeout=30)
    finally:
        assert node.stop() == 0


def test_verify_reads_changed_trusts_an_unchanged_signature_for_a_range(
    ext4: Ext4Image,  # noqa: F811
) -> None:
    """The documented trade-off of KURA_VERIFY_READS=changed holds for ranges as for a 200:
    a blob flipped below the filesystem is served until the scrub finds it."""
    body = os.urandom(2 * MiB)
    store_and_corrupt_below(ext4, body, MiB + 123, verify_reads="changed")
    node = spawn_on(ext4, scrub_interval_seconds=0, verify_reads="changed")
    try:
        r = oneshot.get(
            node.url + "/cache/flip/blob", headers={"Range": f"bytes={MiB}-{MiB + 999}"}
        )
        assert r.status_code == 206
        assert r.content != body[MiB : MiB + 1000]
        assert node.metric(corrupt("read")) == 0
    finally:
        assert node.stop() == 0


def read_syscall_bytes(node: NodeProcess) -> int:
    """Bytes the node's processes (primary and workers) have read with read(2), pread(2) or
    sendfile(2) so far (``rchar``, proc(5))."""
    total = 0
    for pid in [node.proc.pid, *worker_pids(node)]:
        lines = Path(f"/proc/{pid}/io").read_text(encoding="ascii").splitlines()
        total += next(int(line.split()[1]) for line in lines if line.startswith("rchar:"))
    return total


def test_repeated_one_byte_ranges_of_a_large_blob_hash_only_their_block(
    start_node: Callable[..., NodeProcess],
) -> None:
    """20 one-byte ranges of a 128 MiB blob: the first hashes the whole file, the others only
    the 1 MiB block they touch, and every byte served is the stored one. Before (issue 26):
    every range hashed the whole blob, 20 x 128 MiB read."""
    node = start_node(workers=1, process=True)  # one process: its /proc/PID/io is the node's
    body = os.urandom(8 * MiB) * 16
    path = _stored(node, "http_cache", body)
    offsets = [(n * 7_340_033) % len(body) for n in range(20)]
    with node.client() as c:
        before = read_syscall_bytes(node)
        for offset in offsets:
            r = c.get(path, headers={"Range": f"bytes={offset}-{offset}"})
            assert r.status_code == 206
            assert r.content == body[offset : offset + 1]
        read = read_syscall_bytes(node) - before
    assert read < len(body) + 32 * MiB, f"{read / MiB:.0f} MiB read for 20 one-byte ranges"
