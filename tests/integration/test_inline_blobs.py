"""Small bodies are stored inline in the index (``KURA_INLINE_MAX_BYTES``), on every protocol.

For each protocol a small body must land in its index row with no blob file, and a large one in
a file, with GET, HEAD, Range (206 and 416) and conditional requests answering the same either
way. A chunked body (no Content-Length) is buffered up to the threshold and spills to a file past
it. A Bazel ``cas/`` body that does not hash to its path is refused (400) with nothing stored.
Overwrites between an inline and a file version keep only the new version, and a SIGKILL right
after acknowledged inline PUTs loses none of them.
"""

from __future__ import annotations

import hashlib
import os
import signal
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import NodeProcess, node_env, spawn_node
from tests.inline_index import stored_as
from tests.integration import rawhttp

pytestmark = pytest.mark.in_process

KiB = 1024
THRESHOLD = 16 * KiB
SMALL = 3 * KiB
LARGE = 80 * KiB  # above the threshold, and above the 64 KiB small-blob read size


def _paths(kind: str, body: bytes, name: str) -> tuple[str, str]:
    """(PUT path, GET path) of ``body`` under ``kind``."""
    sha = hashlib.sha256(body).hexdigest()
    return {
        "http_cache": (f"/cache/inline/{name}", f"/cache/inline/{name}"),
        "bazel_cas": (f"/cache/cas/{sha}", f"/cache/cas/{sha}"),
        "nx": (f"/v1/cache/{sha[:20]}", f"/v1/cache/{sha[:20]}"),
        "turbo": (f"/v8/artifacts/{sha[:32]}?slug=inline", f"/v8/artifacts/{sha[:32]}?slug=inline"),
    }[kind]


def _chunks(body: bytes, step: int = 1000) -> Iterator[bytes]:
    for i in range(0, len(body), step):
        yield body[i : i + step]


def _check_reads(c: httpx.Client, path: str, body: bytes) -> None:
    r = c.get(path)
    assert r.status_code == 200, (path, r.status_code, r.text)
    assert r.content == body
    h = c.head(path)
    assert h.status_code == 200
    assert int(h.headers["content-length"]) == len(body)
    part = c.get(path, headers={"Range": "bytes=10-2009"})
    assert part.status_code == 206, part.text
    assert part.content == body[10:2010]
    assert part.headers["content-range"] == f"bytes 10-2009/{len(body)}"
    tail = c.get(path, headers={"Range": "bytes=-7"})
    assert tail.status_code == 206
    assert tail.content == body[-7:]
    beyond = c.get(path, headers={"Range": f"bytes={len(body)}-"})
    assert beyond.status_code == 416
    assert beyond.headers["content-range"] == f"bytes */{len(body)}"
    etag = r.headers.get("etag")
    assert etag, r.headers
    assert c.get(path, headers={"If-None-Match": etag}).status_code == 304


def test_small_bodies_are_inline_and_large_ones_files_on_every_protocol(
    start_node: Callable[..., NodeProcess],
) -> None:
    node = start_node(inline_max_bytes=THRESHOLD)
    stored: list[tuple[str, bytes, str]] = []  # (get path, body, expected storage)
    with node.client() as c:
        for kind in ("http_cache", "bazel_cas", "nx", "turbo"):
            for size, chunked in ((SMALL, False), (LARGE, False), (SMALL, True), (LARGE, True)):
                body = os.urandom(size)
                put, get = _paths(kind, body, f"{size}-{chunked}")
                content = _chunks(body) if chunked else body
                r = c.put(put, content=content)
                assert r.status_code in (200, 201, 202), (kind, size, r.status_code, r.text)
                stored.append((get, body, "inline" if size <= THRESHOLD else "file"))
        # Exactly at the threshold is inline; one byte more is a file.
        for size in (THRESHOLD, THRESHOLD + 1):
            body = os.urandom(size)
            assert c.put(f"/cache/inline/edge-{size}", content=body).status_code == 201
            stored.append(
                (f"/cache/inline/edge-{size}", body, "inline" if size == THRESHOLD else "file")
            )
        for get, body, want in stored:
            assert stored_as(node, body) == want, get
            _check_reads(c, get, body)
    files = sum(1 for _g, _b, want in stored if want == "file")
    assert len(node.blob_files()) == files
    assert node.staging_files() == []
    assert node.metric("kura_tmp_reserved_bytes") == 0


def test_a_bazel_cas_body_with_the_wrong_digest_is_400_and_leaves_nothing(
    start_node: Callable[..., NodeProcess],
) -> None:
    node = start_node(inline_max_bytes=THRESHOLD)
    wrong = hashlib.sha256(b"something else").hexdigest()
    with node.client() as c:
        for content in (os.urandom(SMALL), _chunks(os.urandom(SMALL)), os.urandom(LARGE)):
            r = c.put(f"/cache/cas/{wrong}", content=content)
            assert r.status_code == 400, r.text
            assert "digest" in r.text
            assert c.get(f"/cache/cas/{wrong}").status_code == 404
    assert node.index_rows() == 0
    assert node.blob_files() == []
    assert node.staging_files() == []
    assert node.metric("kura_tmp_reserved_bytes") == 0


def test_a_chunked_body_over_the_route_limit_is_413_and_leaves_nothing(
    start_node: Callable[..., NodeProcess],
) -> None:
    # The route's limit below the inline threshold: buffering in memory still enforces it.
    node = start_node(inline_max_bytes=THRESHOLD, max_artifact_bytes=4 * KiB)
    with node.client() as c:
        r = c.put("/cache/inline/too-big", content=_chunks(os.urandom(8 * KiB)))
        assert r.status_code == 413, r.text
        r = c.put("/cache/inline/too-big", content=os.urandom(8 * KiB))
        assert r.status_code == 413, r.text
    assert node.index_rows() == 0
    assert node.blob_files() == []
    assert node.staging_files() == []


def test_overwrites_between_inline_and_file_keep_only_the_new_version(
    start_node: Callable[..., NodeProcess],
) -> None:
    node = start_node(inline_max_bytes=THRESHOLD)
    path = "/cache/inline/flip"
    with node.client() as c:
        for size in (SMALL, LARGE, SMALL, LARGE, LARGE, SMALL, SMALL):
            body = os.urandom(size)
            assert c.put(path, content=body).status_code in (200, 201)
            assert c.get(path).content == body
            assert stored_as(node, body) == ("inline" if size <= THRESHOLD else "file")
            assert node.index_rows() == 1
            assert len(node.blob_files()) == (0 if size <= THRESHOLD else 1)
    assert node.staging_files() == []


def test_zero_turns_inline_storage_off(start_node: Callable[..., NodeProcess]) -> None:
    node = start_node(inline_max_bytes=0)
    body = os.urandom(SMALL)
    with node.client() as c:
        assert c.put("/cache/inline/off", content=body).status_code == 201
        _check_reads(c, "/cache/inline/off", body)
    assert stored_as(node, body) == "file"


def test_kill_9_right_after_acknowledged_inline_puts_loses_none(tmp_path: Path) -> None:
    directory = tmp_path / "node"
    env = node_env(directory, inline_max_bytes=THRESHOLD)
    acked: dict[str, bytes] = {}
    for _round in range(3):
        node = spawn_node(directory, env)
        with node.client() as c:
            for i in range(40):
                key = f"/cache/crash/{len(acked)}-{i}"
                body = os.urandom(100 + i * 300)
                assert c.put(key, content=body).status_code == 201
                acked[key] = body
        node.stop(signal.SIGKILL)  # at once after the last acknowledgement
        node = spawn_node(directory, env)
        with node.client() as c:
            lost = [k for k, body in acked.items() if c.get(k).content != body]
        assert lost == [], f"{len(lost)} of {len(acked)} acknowledged inline writes lost"
        assert all(stored_as(node, body) == "inline" for body in acked.values())
        assert node.blob_files() == []
        node.stop()
    assert len(acked) == 120


def test_a_kill_between_commit_and_unlink_leaves_no_file_beside_the_inline_row(
    tmp_path: Path,
) -> None:
    """file -> inline overwrite, killed after the inline row committed but before the old
    version's file was unlinked: start-up reconcile removes the leftover file."""
    directory = tmp_path / "node"
    plain = node_env(directory, inline_max_bytes=THRESHOLD)
    large, small = os.urandom(LARGE), os.urandom(SMALL)
    node = spawn_node(directory, plain)
    with node.client() as c:
        assert c.put("/cache/inline/k", content=large).status_code == 201
    node.stop()
    faulty = node_env(directory, inline_max_bytes=THRESHOLD, failpoints="storage.after_commit=kill")
    node = spawn_node(directory, faulty)
    with node.client() as c, pytest.raises(httpx.TransportError):
        c.put("/cache/inline/k", content=small)
    assert node.proc.wait(30) == -signal.SIGKILL
    assert len(node.blob_files()) == 1  # the old version's file, left by the kill
    node = spawn_node(directory, plain)
    with node.client() as c:
        assert c.get("/cache/inline/k").content == small  # committed, so it is the version
    assert stored_as(node, small) == "inline"
    assert node.blob_files() == []
    assert node.metric('kura_storage_reconciled_total{kind="file"}') == 1
    node.stop()


def test_inline_bytes_count_against_the_disk_budget_and_are_evicted(
    start_node: Callable[..., NodeProcess],
) -> None:
    budget = 64 * KiB
    node = start_node(inline_max_bytes=THRESHOLD, max_disk_bytes=budget)
    bodies = [os.urandom(8 * KiB) for _ in range(20)]  # 160 KiB written into 64 KiB
    with node.client() as c:
        for i, body in enumerate(bodies):
            assert c.put(f"/cache/evict/{i}", content=body).status_code == 201
            assert node.metric("kura_disk_used_bytes") <= budget
        assert c.get("/cache/evict/19").content == bodies[-1]  # the newest stays
        assert c.get("/cache/evict/0").status_code == 404  # the oldest went
    assert node.metric("kura_disk_used_bytes") == node.index_rows() * 8 * KiB
    assert 0 < node.index_rows() <= budget // (8 * KiB)
    assert node.blob_files() == []


def test_a_small_body_is_stored_while_the_tmp_budget_is_exhausted(
    start_node: Callable[..., NodeProcess],
) -> None:
    """An inline body never touches the tmp dir, so it reserves nothing from the tmp budget: a
    small PUT (with or without ``Expect: 100-continue``) succeeds while a large upload holds
    the whole budget, and a large one is still refused with 503."""
    budget = 1024 * KiB
    node = start_node(inline_max_bytes=THRESHOLD, tmp_dir_max_bytes=budget)
    hog = rawhttp.connect(node.url)
    rawhttp.send_head(hog, "PUT", "/cache/inline/hog", {"Content-Length": str(budget)})
    hog.sendall(b"h" * 1024)
    assert rawhttp.wait_until(lambda: node.metric("kura_tmp_reserved_bytes") == budget)
    small = os.urandom(SMALL)
    sock = rawhttp.connect(node.url)
    with sock:
        headers = {"Content-Length": str(len(small)), "Expect": "100-continue"}
        rawhttp.send_head(sock, "PUT", "/cache/inline/expect", headers)
        status, _h, _b = rawhttp.read_response(sock)
        assert status == 100
        sock.sendall(small)
        status, _h, _b = rawhttp.read_response(sock)
        assert status == 201
    with node.client() as c:
        assert c.put("/cache/inline/plain", content=small[::-1]).status_code == 201
        assert c.put("/cache/inline/large", content=os.urandom(LARGE)).status_code == 503
        assert c.get("/cache/inline/expect").content == small
    assert node.metric("kura_tmp_reserved_bytes") == budget  # only the hog's
    hog.close()
    assert rawhttp.wait_until(lambda: node.metric("kura_tmp_reserved_bytes") == 0)
    assert stored_as(node, small) == "inline"


def test_a_damaged_inline_body_reads_as_a_miss_and_is_quarantined(tmp_path: Path) -> None:
    directory = tmp_path / "node"
    env = node_env(directory, inline_max_bytes=THRESHOLD)
    body, neighbour = os.urandom(SMALL), os.urandom(SMALL)
    node = spawn_node(directory, env)
    with node.client() as c:
        assert c.put("/cache/inline/victim", content=body).status_code == 201
        assert c.put("/cache/inline/neighbour", content=neighbour).status_code == 201
    node.stop()
    db = sqlite3.connect(node.data_dir / "index.sqlite3")
    with db:
        damaged = body[:100] + bytes([body[100] ^ 1]) + body[101:]  # one bit, same length
        n = db.execute(
            "UPDATE artifacts SET inline_body = ? WHERE sha256 = ?",
            (damaged, hashlib.sha256(body).hexdigest()),
        ).rowcount
    db.close()
    assert n == 1
    node = spawn_node(directory, env)
    with node.client() as c:
        assert c.get("/cache/inline/victim").status_code == 404
        assert node.metric('kura_storage_corrupt_artifacts_total{detected_by="read"}') == 1
        assert c.get("/cache/inline/neighbour").content == neighbour
        assert node.index_rows() == 1
        assert len(list((node.data_dir / "quarantine").glob("*.json"))) == 1
        assert node.metric("kura_disk_used_bytes") == len(neighbour)
        assert c.put("/cache/inline/victim", content=body).status_code == 201  # stored again
        assert c.get("/cache/inline/victim").content == body
    node.stop()
