"""Requests on a node whose disk filled while it ran (a REAL 32 MiB tmpfs filled to 100 %):
no route answers 500 because SQLite could not write (``SQLITE_FULL``). A clean (every clean
route) gets 503 with ``Retry-After`` naming the full disk, as writes refused for want of
space do, and works again once space is freed; a read of an
artifact whose blob file is gone is a miss (404; gRPC ``NOT_FOUND``) even though the entry
cannot be dropped from the index meanwhile, and is logged once, not per read
(``kura.api.malformed.disk_full``, ``Eviction._confirm_corrupt_sync``).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import grpc
import pytest

from kura.api.malformed import DISK_FULL_RETRY_SECONDS
from kura_harness.launch.process import free_port
from tests.conftest import NodeProcess, spawn_node
from tests.grpc_api.client import Reapi, blob_name
from tests.integration.test_recovery import fill, full_disk, on_disk

__all__ = ["full_disk"]  # the fixture, used by name

pytestmark = pytest.mark.in_process

LOST = 30  # artifacts whose blob file is removed behind the node's back
CLEANS = [
    "/api/cache/clean?tenant_id=default&namespace_id=nx",  # Kura's route
    "/ns/team1/cache",  # a namespace's route root
]


def _lose(node: NodeProcess, body: bytes) -> None:
    """Remove the blob file holding ``body`` (a row without its file)."""
    prefix = hashlib.sha256(body).hexdigest()[:16]
    (path,) = [p for p in node.blob_files() if p.name.endswith("-" + prefix)]
    path.unlink()


def test_cleans_and_reads_of_lost_files_on_a_full_disk_never_answer_500(
    full_disk: Path,
) -> None:
    env = on_disk(full_disk, inline_max_bytes=0, grpc_port=free_port())
    node = spawn_node(full_disk.parent / "logs", env)
    reapi = Reapi(f"127.0.0.1:{env['KURA_GRPC_PORT']}")
    try:
        lost: list[str] = []
        with node.client() as c:
            for ns in ("nx", "team1"):
                for i in range(3):
                    r = c.put(f"/ns/{ns}/cache/ccache/k{i}", content=os.urandom(2048))
                    assert r.status_code in (200, 201, 204), r.text
            for i in range(LOST):
                body = os.urandom(4096)
                path = f"/ns/lost/cache/ccache/k{i}"
                assert c.put(path, content=body).status_code in (200, 201, 204)
                _lose(node, body)
                lost.append(path)
        cas_blob = os.urandom(8192)
        reapi.write(blob_name(cas_blob), cas_blob)
        _lose(node, cas_blob)
        fill(full_disk)
        with node.client() as c:
            for path in CLEANS:
                r = c.delete(path)
                assert r.status_code == 503, (path, r.status_code, r.text)
                assert int(r.headers["Retry-After"]) == DISK_FULL_RETRY_SECONDS
                assert "the disk is full" in r.json()["message"], r.text
            for path in lost:
                r = c.get(path)
                assert r.status_code == 404, (path, r.status_code, r.text)
            assert c.get("/ns/nx/cache/ccache/k0").status_code == 200  # nothing was cleaned
        with pytest.raises(grpc.RpcError) as missing:
            reapi.read(blob_name(cas_blob))
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND, missing.value.details()
        assert reapi.find_missing([cas_blob]) == [hashlib.sha256(cas_blob).hexdigest()]
        log = node.log()
        assert "Traceback" not in log, log[-3000:]
        assert log.count("could not drop") == 1, log[-3000:]  # once, not per read
        assert node.proc.poll() is None
        # The shortage passes: nothing latched.
        (full_disk / "filler").unlink()
        with node.client() as c:
            for path in CLEANS:
                r = c.delete(path)
                assert r.status_code in (200, 204), (path, r.status_code, r.text)
            assert c.get("/ns/nx/cache/ccache/k0").status_code == 404
            assert c.get("/ns/team1/cache/ccache/k0").status_code == 404
            for path in lost:
                assert c.get(path).status_code == 404
    finally:
        reapi.close()
        assert node.stop() == 0, node.log()[-3000:]
    assert "Traceback" not in node.log(), node.log()[-3000:]
