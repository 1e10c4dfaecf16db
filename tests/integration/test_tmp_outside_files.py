"""Files in the tmp dir that no upload reserved still count against KURA_TMP_DIR_MAX_BYTES, on a
real node whose background walk (storage.tmp_occupancy) measures them: a leftover reduces what
uploads may reserve (503, nothing left behind), and once it is removed uploads fit again."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from tests.conftest import NodeProcess
from tests.integration import rawhttp

pytestmark = pytest.mark.in_process

KiB = 1024


def test_a_leftover_in_the_tmp_dir_reduces_what_uploads_may_reserve_until_it_is_removed(
    start_node: Callable[..., NodeProcess],
) -> None:
    node = start_node(tmp_dir_max_bytes=1024 * KiB)
    leftover = node.tmp_dir / "someone-elses-file"
    leftover.write_bytes(b"l" * (800 * KiB))
    # The walk runs every 250 ms in a thread; wait for the node to have seen the file.
    assert rawhttp.wait_until(lambda: node.metric("kura_tmp_dir_bytes") >= 800 * KiB)
    rows = node.index_rows()
    with node.client() as c:
        r = c.put("/cache/too-big-with-the-leftover", content=os.urandom(300 * KiB))
        assert r.status_code == 503, r.text
        assert "819200 bytes of other files" in r.json()["message"]
        assert int(r.headers["Retry-After"]) >= 1
        assert node.index_rows() == rows  # the refusal left nothing behind
        assert node.staging_files() == [leftover]
        assert node.metric("kura_tmp_reserved_bytes") == 0
        assert c.put("/cache/small-fits-beside-it", content=b"s" * (100 * KiB)).status_code == 201

        leftover.unlink()
        body = os.urandom(300 * KiB)
        assert rawhttp.wait_until(
            lambda: c.put("/cache/fits-once-it-is-gone", content=body).status_code == 201
        )
        assert c.get("/cache/fits-once-it-is-gone").content == body
    assert rawhttp.wait_until(lambda: node.metric("kura_tmp_dir_bytes") == 0)
    assert node.metric("kura_tmp_reserved_bytes") == 0


def test_a_small_chunked_body_beside_a_nearly_full_budget_reserves_only_what_arrives(
    start_node: Callable[..., NodeProcess],
) -> None:
    """A body without a Content-Length reserves one 1 MiB step when that fits; when it does not,
    it reserves as its bytes arrive, so a 40 KiB chunked PUT fits beside a leftover that leaves
    less than a step free, and one that does not fit is still refused with nothing left."""
    node = start_node(tmp_dir_max_bytes=1024 * KiB)
    leftover = node.tmp_dir / "someone-elses-file"
    leftover.write_bytes(b"l" * (700 * KiB))
    assert rawhttp.wait_until(lambda: node.metric("kura_tmp_dir_bytes") >= 700 * KiB)
    small = os.urandom(40 * KiB)
    pieces = [small[i : i + 8 * KiB] for i in range(0, len(small), 8 * KiB)]
    with node.client() as c:
        r = c.put("/cache/chunked-small", content=iter(pieces))  # no Content-Length: chunked
        assert r.status_code == 201, r.text
        assert c.get("/cache/chunked-small").content == small
        rows = node.index_rows()
        big = os.urandom(400 * KiB)
        r = c.put("/cache/chunked-too-big", content=iter([big[: 200 * KiB], big[200 * KiB :]]))
        assert r.status_code == 503, r.text
        assert node.index_rows() == rows  # the refusal left nothing behind
        assert node.staging_files() == [leftover]
    assert rawhttp.wait_until(lambda: node.metric("kura_tmp_reserved_bytes") == 0)


def test_a_chunked_multipart_part_holds_only_its_real_size_while_its_upload_is_open(
    start_node: Callable[..., NodeProcess],
) -> None:
    """A part without a Content-Length reserves up to the part limit while it streams; once
    staged it holds its real size until the upload completes, so open uploads of small chunked
    parts do not starve every other write of the tmp budget."""
    node = start_node(tmp_dir_max_bytes=2560 * KiB)
    q = "tenant_id=acme&hash=h1&name=n1&cache_category=builds"
    part = os.urandom(20 * KiB)
    with node.client() as c:
        upload_id = c.post(f"/api/cache/module/start?{q}").json()["upload_id"]
        r = c.post(
            f"/api/cache/module/part?{q}&upload_id={upload_id}&part_number=1",
            content=iter([part[: 10 * KiB], part[10 * KiB :]]),  # chunked
        )
        assert r.status_code == 204, r.text
        assert node.metric("kura_tmp_reserved_bytes") == len(part)
        other = os.urandom(2 * 1024 * KiB)  # fits only if the part gave its step back
        assert c.put("/cache/beside-the-open-upload", content=other).status_code == 201
        r = c.post(f"/api/cache/module/complete?{q}&upload_id={upload_id}", json={"parts": [1]})
        assert r.status_code == 204, r.text
        assert c.get(f"/api/cache/module/h1?{q}").content == part
    assert rawhttp.wait_until(lambda: node.metric("kura_tmp_reserved_bytes") == 0)
