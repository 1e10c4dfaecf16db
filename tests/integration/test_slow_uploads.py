"""Clients that hold staging budget without using it are cut off (issue 10 §7): an upload slower
than the minimum rate after the grace period, on every route that takes a body, and idle
multipart uploads once the open-upload cap is reached."""

from __future__ import annotations

import json
import os
import select
import socket
import threading
import time
from collections.abc import Callable

import pytest

from kura.core.keys import artifact_id
from tests.conftest import NodeProcess
from tests.integration import rawhttp

pytestmark = pytest.mark.in_process

MiB = 1024 * 1024
GRACE_SECONDS = 3
MODULE = "tenant_id=acme&namespace_id=app&name=Mod.framework"


def _replica_head(key: str, size: int) -> dict[str, str]:
    now = int(time.time() * 1000)
    manifest = {
        "artifact_id": artifact_id("http", "default", "", key),
        "producer": "http",
        "namespace_id": "",
        "key": key,
        "content_type": "application/octet-stream",
        "size": size,
        "sha256": "0" * 64,
        "version_ms": now,
        "created_at_ms": now,
    }
    return {
        "Content-Length": str(size),
        "Kura-Manifest": json.dumps(manifest, separators=(",", ":")),
    }


def test_trickling_uploads_are_aborted_after_the_grace_period_on_every_route(
    start_node: Callable[..., NodeProcess],
) -> None:
    """Four connections (HTTP cache, Turborepo, a module part, a peer replica) declare large
    bodies and send a byte a second, holding the whole tmp budget; a fifth upload at a modest
    but acceptable rate runs beside them."""
    held = 16 * MiB + 16 * MiB + 10 * MiB + 16 * MiB
    node = start_node(
        tmp_dir_max_bytes=held + MiB // 2,
        min_upload_bytes_per_second=16 * 1024,
        upload_grace_seconds=GRACE_SECONDS,
        body_idle_timeout_seconds=60,
    )
    with node.client() as c:
        upload_id = c.post(f"/api/cache/module/start?{MODULE}&hash=h1").json()["upload_id"]
    trickles: list[tuple[str, str, str, dict[str, str]]] = [
        (node.url, "PUT", "/cache/t0", {"Content-Length": str(16 * MiB)}),
        (node.url, "PUT", "/v8/artifacts/t1?teamId=t", {"Content-Length": str(16 * MiB)}),
        (
            node.url,
            "POST",
            f"/api/cache/module/part?upload_id={upload_id}&part_number=1",
            {"Content-Length": str(10 * MiB)},
        ),
        (node.internal_url, "PUT", "/_internal/replicate/artifact", _replica_head("t3", 16 * MiB)),
    ]
    socks: list[socket.socket] = []
    for url, method, path, headers in trickles:
        s = rawhttp.connect(url, timeout=60)
        rawhttp.send_head(s, method, path, headers)
        s.sendall(b"x")
        socks.append(s)
    started = time.monotonic()
    assert rawhttp.wait_until(lambda: node.metric("kura_tmp_reserved_bytes") == held)
    with node.client() as c:
        assert c.put("/cache/blocked", content=os.urandom(MiB)).status_code == 503

    # A modest upload (64 KiB/s, four times the minimum) that outlasts the grace period.
    modest: list[int] = []

    def send_modest() -> None:
        with rawhttp.connect(node.url, timeout=60) as s:
            rawhttp.send_head(s, "PUT", "/cache/modest", {"Content-Length": str(8 * 40 * 1024)})
            for _ in range(40):
                s.sendall(b"m" * 8 * 1024)
                time.sleep(0.125)
            modest.append(rawhttp.read_response(s)[0])

    writer = threading.Thread(target=send_modest)
    writer.start()

    answers: dict[int, tuple[int, bytes, float]] = {}
    while len(answers) < len(socks) and time.monotonic() - started < GRACE_SECONDS + 30:
        readable, _w, _x = select.select(
            [s for s in socks if socks.index(s) not in answers], [], [], 1.0
        )
        for s in readable:
            status, _h, body = rawhttp.read_response(s)
            answers[socks.index(s)] = (status, body, time.monotonic() - started)
        for i, s in enumerate(socks):
            if i not in answers:
                s.sendall(b"x")  # a byte a second
    for s in socks:
        # Closed at once, not after aiohttp's 10 s lingering read of the body that never comes.
        s.settimeout(3)
        try:
            s.sendall(b"x")
            assert s.recv(1) == b""
        except (ConnectionResetError, BrokenPipeError):
            pass  # closed with our byte unread (a reset), or reset before it was sent: closed too
        s.close()
    writer.join(60)

    assert sorted(answers) == [0, 1, 2, 3], answers
    for status, body, after in answers.values():
        assert status == 400
        assert b"upload too slow" in body
        assert GRACE_SECONDS - 0.5 <= after < GRACE_SECONDS + 15
    assert modest == [201]
    assert rawhttp.wait_until(lambda: node.metric("kura_tmp_reserved_bytes") == 0)
    assert node.staging_files() == []
    assert node.metric('kura_http_aborted_uploads_total{reason="slow"}') == 4
    assert node.log().count("aborted a ") == 4  # logged once each
    # The budget is whole again: ordinary uploads succeed.
    with node.client() as c:
        for i in range(5):
            assert c.put(f"/cache/after{i}", content=os.urandom(4 * MiB)).status_code == 201
    assert node.index_rows() == 6  # modest + five; nothing of the aborted ones


def test_idle_multipart_uploads_are_reclaimed_at_the_cap(
    start_node: Callable[..., NodeProcess],
) -> None:
    from kura.storage.multipart import MAX_OPEN_UPLOADS

    node = start_node(
        multipart_upload_idle_seconds=2, multipart_uploads_per_namespace=2 * MAX_OPEN_UPLOADS
    )
    part = os.urandom(MiB)
    with node.client() as c:
        # The oldest upload holds a part: reclaiming it must free the part and its budget.
        first = c.post(f"/api/cache/module/start?{MODULE}&hash=f0").json()["upload_id"]
        base = f"/api/cache/module/part?upload_id={first}"
        assert c.post(f"{base}&part_number=1", content=part).status_code == 204
        for i in range(1, MAX_OPEN_UPLOADS):
            r = c.post(f"/api/cache/module/start?{MODULE}&hash=f{i}")
            assert r.status_code == 200, (i, r.text)
        assert node.metric("kura_tmp_reserved_bytes") == MiB
        # Past the idle bound, a real upload gets in: start → parts → complete.
        time.sleep(2.5)
        r = c.post(f"/api/cache/module/start?{MODULE}&hash=real")
        assert r.status_code == 200, r.text
        real = r.json()["upload_id"]
        assert node.metric("kura_tmp_reserved_bytes") == 0  # the reclaimed upload's part
        assert node.metric("kura_multipart_reclaimed_uploads_total") == 1
        base = f"/api/cache/module/part?upload_id={real}"
        assert c.post(f"{base}&part_number=1", content=part[:1000]).status_code == 204
        assert c.post(f"{base}&part_number=2", content=part[1000:]).status_code == 204
        done = c.post(f"/api/cache/module/complete?upload_id={real}", json={"parts": [1, 2]})
        assert done.status_code == 204, done.text
        r = c.get(f"/api/cache/module/x?{MODULE}&hash=real")
        assert (r.status_code, r.content == part) == (200, True)
        # The reclaimed upload is gone for good.
        assert (
            c.post(
                f"/api/cache/module/part?upload_id={first}&part_number=2", content=b"x"
            ).status_code
            == 404
        )
    assert node.staging_files() == []
    assert "reclaimed the least recently active idle or too slow upload" in node.log()


def test_the_cap_refuses_only_when_every_open_upload_is_active(
    start_node: Callable[..., NodeProcess],
) -> None:
    from kura.storage.multipart import MAX_OPEN_UPLOADS

    node = start_node(
        multipart_upload_idle_seconds=3600,
        upload_grace_seconds=3600,
        multipart_uploads_per_namespace=2 * MAX_OPEN_UPLOADS,
    )
    with node.client() as c:
        for i in range(MAX_OPEN_UPLOADS):
            assert c.post(f"/api/cache/module/start?{MODULE}&hash=a{i}").status_code == 200
        r = c.post(f"/api/cache/module/start?{MODULE}&hash=one-more")
    assert r.status_code == 503
    assert r.headers["Retry-After"] == "5"
    assert "each was active within the last 3600 s" in r.json()["message"]
    assert node.metric("kura_multipart_reclaimed_uploads_total") == 0


def test_uploads_kept_alive_by_a_trickle_of_tiny_parts_are_reclaimed_for_a_real_one(
    start_node: Callable[..., NodeProcess],
) -> None:
    """Issue 26: 1,024 uploads (256 in each of four namespaces), each sent a 1-byte part within
    the idle bound, held every slot and refused every other ``start``. Past the grace period,
    an upload that received less than the minimum rate over its age is reclaimable."""
    from kura.storage.multipart import MAX_OPEN_UPLOADS

    node = start_node(multipart_upload_idle_seconds=60, upload_grace_seconds=2)
    with node.client() as c:
        for i in range(MAX_OPEN_UPLOADS):
            ns = f"tenant_id=acme&namespace_id=t{i % 4}&name=M"
            r = c.post(f"/api/cache/module/start?{ns}&hash=a{i}")
            assert r.status_code == 200, (i, r.text)
            upload_id = r.json()["upload_id"]
            part = f"/api/cache/module/part?upload_id={upload_id}&part_number=1"
            assert c.post(part, content=b"x").status_code == 204
        starts: list[int] = []

        def real_start() -> bool:
            r = c.post(f"/api/cache/module/start?{MODULE}&hash=real")
            starts.append(r.status_code)
            return r.status_code == 200

        # Every upload got a part less than 60 s ago: only their too slow progress frees one.
        assert rawhttp.wait_until(real_start, timeout=15, interval=0.5), starts
        real = c.post(f"/api/cache/module/start?{MODULE}&hash=real2").json()["upload_id"]
        body = os.urandom(MiB)
        base = f"/api/cache/module/part?upload_id={real}&part_number="
        assert c.post(base + "1", content=body).status_code == 204
        done = c.post(f"/api/cache/module/complete?upload_id={real}", json={"parts": [1]})
        assert done.status_code == 204, done.text
        assert c.get(f"/api/cache/module/x?{MODULE}&hash=real2").content == body
    assert node.metric("kura_multipart_reclaimed_uploads_total") == 2
    assert node.metric("kura_tmp_reserved_bytes") == MAX_OPEN_UPLOADS - 2  # their 1-byte parts


def test_one_namespace_cannot_hold_more_than_its_share_of_uploads(
    start_node: Callable[..., NodeProcess],
) -> None:
    node = start_node(
        multipart_upload_idle_seconds=3600,
        upload_grace_seconds=3600,
        multipart_uploads_per_namespace=3,
    )
    greedy = "tenant_id=acme&namespace_id=greedy&name=M"
    with node.client() as c:
        for i in range(3):
            assert c.post(f"/api/cache/module/start?{greedy}&hash=g{i}").status_code == 200
        r = c.post(f"/api/cache/module/start?{greedy}&hash=g3")
        assert r.status_code == 503, r.text
        assert r.headers["Retry-After"] == "5"
        assert "namespace 'greedy' has 3 multipart uploads" in r.json()["message"]
        assert c.post(f"/api/cache/module/start?{MODULE}&hash=other").status_code == 200
    assert node.metric("kura_multipart_reclaimed_uploads_total") == 0
