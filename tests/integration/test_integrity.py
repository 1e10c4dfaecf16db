"""Integrity of what is served, against real node processes (storage.verify, storage.quarantine,
storage.scrub, api.file_response): damaged bytes are never served as a complete 200, a damaged
size never yields a short 200 or a hung connection, damaged entries are quarantined (not
deleted), the scrub finds damage nobody reads, and a PUT over a damaged copy repairs it.

Silent corruption is made real with an ext4 image (tests/integration/ext4.py): the byte is
flipped in the image while the filesystem is unmounted, so the file's stat signature is exactly
what the node recorded.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests import oneshot
from tests.conftest import NodeProcess, node_env, spawn_node
from tests.e2e.mesh import wait_for
from tests.integration import rawhttp
from tests.integration.ext4 import Ext4Image

pytestmark = pytest.mark.in_process

KiB = 1024
MiB = 1024 * KiB
SCOPE = "tenant_id=acme&namespace_id=app"


def corrupt(by: str) -> str:
    return f'kura_storage_corrupt_artifacts_total{{detected_by="{by}"}}'


def flip_byte(path: Path, offset: int) -> None:
    """Through the filesystem (ctime changes): enough for checks that always hash."""
    with path.open("r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))


def outcome(url: str, body: bytes, timeout: float = 30.0) -> str:
    """One GET: "ok" (200, right bytes), "wrong" (a complete 200 with other bytes), "miss"
    (404), "aborted" (the transfer failed), "hung" (no progress for ``timeout``)."""
    try:
        r = oneshot.get(url, timeout=timeout)
    except httpx.TimeoutException:
        return "hung"
    except httpx.TransportError:
        return "aborted"
    if r.status_code == 404:
        return "miss"
    if r.status_code == 200:
        return "ok" if r.content == body else "wrong"
    return f"status {r.status_code}"


def quarantined(node: NodeProcess) -> list[Path]:
    return sorted(p for p in (node.data_dir / "quarantine").glob("*") if p.suffix != ".json")


def records(node: NodeProcess) -> list[dict[str, object]]:
    return [
        json.loads(p.read_text()) for p in sorted((node.data_dir / "quarantine").glob("*.json"))
    ]


def nothing_behind(node: NodeProcess) -> None:
    assert node.staging_files() == []
    assert node.metric("kura_tmp_reserved_bytes") == 0


@pytest.fixture
def ext4(tmp_path: Path) -> Iterator[Ext4Image]:
    image = Ext4Image(tmp_path / "fs.img", tmp_path / "fs")
    yield image
    if image.mounted:
        # A node a failed test left running still holds files: detach lazily.
        os.system(f"umount -l {image.mountpoint}")


def spawn_on(ext4: Ext4Image, **settings: object) -> NodeProcess:
    directory = ext4.mountpoint / "node"
    return spawn_node(directory, node_env(directory, **settings))


def stat_sig(path: Path) -> tuple[int, int, int, int]:
    st = path.stat()
    return (st.st_size, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)


def store_and_corrupt_below(ext4: Ext4Image, body: bytes, offset: int, **settings: object) -> Path:
    """Store ``body`` at /cache/flip/blob on a node on ``ext4``, stop it, flip the byte at
    ``offset`` below the filesystem, and return the blob path (stat signature unchanged)."""
    node = spawn_on(ext4, scrub_interval_seconds=0, **settings)
    try:
        with node.client() as c:
            assert c.put("/cache/flip/blob", content=body).status_code == 201
            assert c.get("/cache/flip/blob").content == body
        (path,) = node.blob_files()
    finally:
        assert node.stop() == 0
    before = stat_sig(path)
    ext4.flip_byte_below(path, offset)
    assert stat_sig(path) == before  # the node's view of the file is unchanged ...
    assert hashlib.sha256(path.read_bytes()).hexdigest() != hashlib.sha256(body).hexdigest()
    return path  # ... but its bytes are not


# -- silent corruption ------------------------------------------------------------------------


def test_a_byte_flipped_below_the_filesystem_is_never_served_and_a_put_repairs_it(
    ext4: Ext4Image,
) -> None:
    body = os.urandom(2 * MiB)
    path = store_and_corrupt_below(ext4, body, MiB + 123)
    node = spawn_on(ext4, scrub_interval_seconds=0)
    try:
        url = node.url + "/cache/flip/blob"
        with ThreadPoolExecutor(16) as pool:
            seen = Counter(pool.map(lambda _i: outcome(url, body), range(48)))
        assert seen["wrong"] == 0, seen
        assert seen["hung"] == 0, seen
        assert seen["ok"] == 0, seen
        assert seen["aborted"] >= 1, seen
        assert seen["aborted"] + seen["miss"] == 48, seen
        assert node.metric(corrupt("read")) == 1
        assert node.index_rows() == 0
        assert node.blob_files() == []
        assert node.metric("kura_disk_used_bytes") == 0
        # Quarantined, not deleted: the damaged bytes and what they should have been.
        (kept,) = quarantined(node)
        assert kept.read_bytes() != body
        assert len(kept.read_bytes()) == len(body)
        (rec,) = records(node)
        assert rec["expected_sha256"] == hashlib.sha256(body).hexdigest()
        assert rec["expected_size"] == len(body)
        assert rec["detected_by"] == "read"
        assert node.metric("kura_storage_quarantine_bytes") == len(body)
        log = node.log()
        assert "quarantined artifact" in log
        assert hashlib.sha256(body).hexdigest() in log
        assert not path.exists()
        # Without peers it is a miss; a client's PUT of the right bytes repairs it.
        assert outcome(url, body) == "miss"
        with node.client() as c:
            assert c.put("/cache/flip/blob", content=body).status_code == 201
        assert outcome(url, body) == "ok"
        assert node.metric("kura_disk_used_bytes") == len(body)
    finally:
        assert node.stop() == 0


def test_verify_reads_changed_trusts_an_unchanged_stat_signature(ext4: Ext4Image) -> None:
    """The documented trade-off of KURA_VERIFY_READS=changed (and proof that the damage above
    is invisible to the node's stat view): the flipped blob is served, until the scrub runs."""
    body = os.urandom(2 * MiB)
    store_and_corrupt_below(ext4, body, MiB + 123, verify_reads="changed")
    node = spawn_on(ext4, scrub_interval_seconds=0, verify_reads="changed")
    try:
        assert outcome(node.url + "/cache/flip/blob", body) == "wrong"
        assert node.metric(corrupt("read")) == 0
    finally:
        assert node.stop() == 0


def test_the_scrub_finds_damage_nobody_reads_within_its_period(ext4: Ext4Image) -> None:
    body = os.urandom(2 * MiB)
    store_and_corrupt_below(ext4, body, 2 * MiB - 5)
    # An inline (key-value) entry and an intact neighbour, written with the node stopped.
    node = spawn_on(ext4, scrub_interval_seconds=0)
    neighbour = os.urandom(300 * KiB)
    try:
        with node.client() as c:
            assert c.put("/cache/flip/neighbour", content=neighbour).status_code == 201
            doc = {"cas_id": "kv1", "entries": [{"value": "a"}]}
            assert c.put(f"/api/cache/keyvalue?{SCOPE}", json=doc).status_code == 204
    finally:
        assert node.stop() == 0
    db = sqlite3.connect(node.data_dir / "index.sqlite3")
    with db:
        n = db.execute(
            "UPDATE artifacts SET inline_body = CAST('garbage!' AS BLOB) WHERE inline_body IS NOT NULL"
        ).rowcount
    db.close()
    assert n == 1
    period = 3
    node = spawn_on(ext4, scrub_interval_seconds=period, scrub_max_bytes_per_second=64 * MiB)
    try:
        started = time.monotonic()
        assert wait_for(lambda: node.metric("kura_scrub_passes_total") >= 1, period + 30)
        found_after = time.monotonic() - started
        assert node.metric(corrupt("scrub")) == 2
        assert node.metric(corrupt("read")) == 0  # nobody read it: the scrub found it
        assert found_after < period + 30
        assert node.metric("kura_scrub_scrubbed_bytes_total") >= len(neighbour)
        assert sorted(str(r["detected_by"]) for r in records(node)) == ["scrub", "scrub"]
        assert len(quarantined(node)) == 2  # the file and the inline body
        assert node.index_rows() == 1
        with node.client() as c:
            assert c.get("/cache/flip/neighbour").content == neighbour
            assert c.get("/cache/flip/blob").status_code == 404
            assert c.get(f"/api/cache/keyvalue/kv1?{SCOPE}").status_code == 404
        # Later passes keep running and find nothing new.
        assert wait_for(lambda: node.metric("kura_scrub_passes_total") >= 2, period + 30)
        assert node.metric(corrupt("scrub")) == 2
    finally:
        assert node.stop() == 0


# -- damaged size -----------------------------------------------------------------------------


def test_a_row_whose_size_no_longer_matches_its_file_never_hangs_nor_serves_short(
    start_node: Callable[..., NodeProcess],
) -> None:
    node = start_node()
    bodies = {"longer": os.urandom(2 * MiB), "shorter": os.urandom(MiB), "small": b"s" * 1000}
    with node.client() as c:
        for key, body in bodies.items():
            assert c.put(f"/cache/size/{key}", content=body).status_code == 201
    node.stop()
    db = sqlite3.connect(node.data_dir / "index.sqlite3")
    with db:
        for key, delta in (("longer", 4096), ("shorter", -4096), ("small", 10)):
            changed = db.execute(
                "UPDATE artifacts SET size = size + ? WHERE key LIKE ?", (delta, f"%{key}")
            ).rowcount
            assert changed == 1, key
    db.close()
    node = spawn_node(node.log_path.parent, node.env)
    try:
        for key, body in bodies.items():
            started = time.monotonic()
            assert outcome(node.url + f"/cache/size/{key}", body, timeout=20) == "miss", key
            assert time.monotonic() - started < 20
        assert node.metric(corrupt("read")) == 3
        assert node.index_rows() == 0
        assert len(quarantined(node)) == 3
        assert node.metric("kura_disk_used_bytes") == 0
    finally:
        node.stop()


def test_a_file_truncated_while_it_is_sent_aborts_the_transfer_and_is_quarantined(
    node: NodeProcess,
) -> None:
    body = os.urandom(32 * MiB)
    with node.client() as c:
        assert c.put("/cache/size/big", content=body).status_code == 201
    (path,) = node.blob_files()
    received = 0
    started = time.monotonic()
    with (
        httpx.Client(timeout=20) as c,
        c.stream("GET", node.url + "/cache/size/big") as r,
    ):
        assert r.status_code == 200
        assert int(r.headers["Content-Length"]) == len(body)
        chunks = r.iter_raw(64 * KiB)
        received += len(next(chunks))
        os.truncate(path, 16 * MiB)  # the client holds back: sendfile is still running
        failure: Exception | None = None
        try:
            for chunk in chunks:
                received += len(chunk)
        except httpx.TransportError as exc:
            failure = exc
    assert isinstance(failure, httpx.TransportError), "a short body completed cleanly"
    assert not isinstance(failure, httpx.TimeoutException)  # failed, did not hang
    assert time.monotonic() - started < 20
    assert received < len(body)
    assert wait_for(lambda: node.index_rows() == 0, 10)
    assert node.metric(corrupt("read")) == 1
    assert len(quarantined(node)) == 1
    with node.client() as c:
        assert c.get("/cache/size/big").status_code == 404
        assert c.get("/up").status_code == 200


def test_a_file_truncated_at_rest_is_a_miss(node: NodeProcess) -> None:
    with node.client() as c:
        assert c.put("/cache/size/t", content=os.urandom(MiB)).status_code == 201
        (path,) = node.blob_files()
        os.truncate(path, MiB // 2)
        assert c.get("/cache/size/t").status_code == 404
    assert node.metric(corrupt("read")) == 1
    assert len(quarantined(node)) == 1


# -- PUT over a damaged copy ------------------------------------------------------------------

OLD = os.urandom(100 * KiB)
NEW = os.urandom(120 * KiB)
CAS_KEY = hashlib.sha256(OLD).hexdigest()
# (name, method, url, status of a PUT, body the second PUT sends)
SKIPPING_ROUTES = [
    ("bazel cas", "PUT", f"/cache/cas/{CAS_KEY}", (200, 200), OLD),
    ("nx", "PUT", "/v1/cache/12345", (200, 200), NEW),
    ("gradle", "PUT", f"/api/cache/gradle/k1?{SCOPE}", (201, 201), NEW),
    ("xcode", "POST", f"/api/cache/cas/obj1?{SCOPE}", (204, 204), NEW),
]


def test_a_put_over_a_damaged_copy_stores_the_new_body_on_every_skipping_route(
    node: NodeProcess,
) -> None:
    with node.client() as c:
        for name, method, url, (first, second), again in SKIPPING_ROUTES:
            before = node.blob_files()
            assert c.request(method, url, content=OLD).status_code == first, name
            (path,) = [p for p in node.blob_files() if p not in before]
            # Intact: the body is skipped, the stored copy stays.
            assert c.request(method, url, content=NEW if again is NEW else OLD).status_code in (
                200,
                204,
            ), name
            assert c.get(url).content == OLD, name
            flip_byte(path, 70 * KiB)
            r = c.request(method, url, content=again)
            assert r.status_code == second, (name, r.status_code, r.text)
            assert c.get(url).content == again, name
    n = len(SKIPPING_ROUTES)
    assert node.metric(corrupt("put")) == n
    assert len(quarantined(node)) == n
    assert node.index_rows() == n
    nothing_behind(node)


def test_bad_input_over_a_damaged_copy_leaves_nothing_behind(node: NodeProcess) -> None:
    with node.client() as c:
        assert c.put(f"/cache/cas/{CAS_KEY}", content=OLD).status_code == 200
        assert c.put("/v1/cache/777", content=OLD).status_code == 200
    paths = node.blob_files()
    for path in paths:
        flip_byte(path, 1)
    with node.client() as c:
        # A body that does not hash to the digest in its path: 400, the damaged copy is gone.
        r = c.put(f"/cache/cas/{CAS_KEY}", content=NEW)
        assert r.status_code == 400
        assert "sha256" in r.text
    # A body shorter than its Content-Length, then a disconnect.
    sock = rawhttp.connect(node.url)
    rawhttp.send_head(sock, "PUT", "/v1/cache/777", {"Content-Length": str(len(OLD))})
    sock.sendall(OLD[:1000])
    sock.close()
    assert wait_for(lambda: node.metric(corrupt("put")) == 2, 10)
    assert wait_for(lambda: node.metric("kura_tmp_reserved_bytes") == 0, 10)
    assert node.index_rows() == 0
    assert node.blob_files() == []
    assert node.metric("kura_disk_used_bytes") == 0
    nothing_behind(node)
    assert len(quarantined(node)) == 2


# -- the quarantine's bound -------------------------------------------------------------------


def test_the_quarantine_keeps_within_its_byte_bound_dropping_the_oldest(
    start_node: Callable[..., NodeProcess],
) -> None:
    node = start_node(quarantine_max_bytes=250 * KiB)
    with node.client() as c:
        for i in range(3):
            body = os.urandom(100 * KiB)
            before = node.blob_files()
            assert c.put(f"/cache/q/{i}", content=body).status_code == 201
            (path,) = [p for p in node.blob_files() if p not in before]
            flip_byte(path, 50 * KiB)
            assert outcome(node.url + f"/cache/q/{i}", body) in ("aborted", "miss")
            assert wait_for(lambda n=i: node.metric(corrupt("read")) == n + 1, 10)
    kept = quarantined(node)
    assert len(kept) == 2
    assert sum(p.stat().st_size for p in kept) <= 250 * KiB
    assert node.metric("kura_storage_quarantine_bytes") == 200 * KiB
    assert sorted(str(r["key"]) for r in records(node)) == ["q/1", "q/2"]  # the oldest went


# -- the scrub's rate -------------------------------------------------------------------------


def test_the_scrub_never_hashes_faster_than_its_byte_rate(
    start_node: Callable[..., NodeProcess],
) -> None:
    rate = 1 * MiB
    node = start_node(scrub_interval_seconds=1, scrub_max_bytes_per_second=rate)
    with node.client() as c:
        for i in range(4):
            assert c.put(f"/cache/rate/{i}", content=os.urandom(MiB)).status_code == 201
    # Passes may have run before and while the bodies were stored (a pass starts every second
    # from start-up, and a node with workers can take seconds to be ready): the pass after the
    # one running now is the first to find all four. It starts when that one ends (or up to
    # the interval later), so it is timed from the first sample that counts the one before.
    before = node.metric("kura_scrub_passes_total")
    samples: list[tuple[float, float, float]] = []  # (time, bytes hashed, passes done)

    def sample() -> bool:
        m = node.metrics()
        passes = m.get("kura_scrub_passes_total", 0.0)
        samples.append((time.monotonic(), m.get("kura_scrub_scrubbed_bytes_total", 0.0), passes))
        return passes >= before + 2

    assert wait_for(sample, 60, interval=0.1)
    start, base = next((t, n) for t, n, p in samples if p >= before + 1)
    done = samples[-1][0]
    # 4 MiB at 1 MiB/s: the first chunk (1 MiB) is free, the other three take >= 3 s.
    assert done - start >= 3 * MiB / rate - 0.5, samples
    for t, n, _p in samples:
        if t >= start:
            assert n - base <= rate * (t - start) + 2 * MiB, (t - start, n - base)
    assert node.metric(corrupt("scrub")) == 0
