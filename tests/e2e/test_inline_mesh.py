"""Inline rows of every protocol travel like files: replication to a peer, bootstrap of a fresh
node, and anti-entropy repair of rows a node lost behind its back, each arriving inline when
small and as a file when large (``KURA_INLINE_MAX_BYTES``), with the bytes served intact."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from tests.conftest import NodeProcess
from tests.e2e.mesh import Mesh, forget_behind_the_cursor, manifests, status, wait_for
from tests.e2e.test_bootstrap import start_joiner
from tests.inline_index import stored_as

KiB = 1024
THRESHOLD = 16 * KiB
FAST = {"discovery_settle_ms": 0, "anti_entropy_interval": "0.5", "replication_backoff_max_ms": 500}


def _path(kind: str, body: bytes, tag: str) -> str:
    sha = hashlib.sha256(body).hexdigest()
    return {
        "http_cache": f"/cache/{tag}/{sha[:12]}",
        "bazel_cas": f"/cache/cas/{sha}",
        "nx": f"/v1/cache/{sha[:24]}",
        "turbo": f"/v8/artifacts/{sha[:32]}?slug={tag}",
    }[kind]


def _write_all(node: NodeProcess, tag: str) -> dict[str, bytes]:
    """A small and a large body on each HTTP protocol; returns path (PUT and GET) -> body."""
    written: dict[str, bytes] = {}
    with node.client() as c:
        for size in (2 * KiB, 100 * KiB):
            for kind in ("http_cache", "bazel_cas", "nx", "turbo"):
                body = os.urandom(size)
                path = _path(kind, body, tag)
                r = c.put(path, content=body)
                assert r.status_code in (200, 201, 202), (path, r.status_code, r.text)
                written[path] = body
    return written


def _holds(node: NodeProcess, written: dict[str, bytes]) -> bool:
    have = {m["sha256"] for m in manifests(node).values()}
    return all(hashlib.sha256(b).hexdigest() in have for b in written.values())


def _assert_served_and_stored(node: NodeProcess, written: dict[str, bytes]) -> None:
    with node.client() as c:
        for path, body in written.items():
            r = c.get(path)
            assert r.status_code == 200, (path, r.text)
            assert r.content == body, path
            want = "inline" if len(body) <= THRESHOLD else "file"
            assert stored_as(node, body) == want, (node.url, path)


def test_inline_and_file_rows_replicate_bootstrap_and_are_repaired(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path, 2, in_process=True, inline_max_bytes=THRESHOLD, **FAST)
    a, b = mesh.nodes
    joiner: NodeProcess | None = None
    try:
        mesh.wait_ready()
        written = _write_all(a, "mesh")
        assert len(written) == 8
        mesh.wait_drained()
        assert wait_for(lambda: _holds(b, written), 60)
        _assert_served_and_stored(a, written)
        _assert_served_and_stored(b, written)  # replicated: inline when small, a file when large

        # A fresh node bootstraps from both and ends up with the same storage.
        joiner = start_joiner(tmp_path / "fresh", mesh.internal_urls, inline_max_bytes=THRESHOLD)
        assert wait_for(lambda: status(joiner)["ready"] is True, 60), status(joiner)
        assert _holds(joiner, written)
        _assert_served_and_stored(joiner, written)
        assert joiner.staging_files() == []

        # B loses a small and a large row behind its back: anti-entropy repairs both.
        lost = [body for body in written.values() if len(body) == 2 * KiB][:2]
        lost += [body for body in written.values() if len(body) == 100 * KiB][:2]
        assert b.stop() == 0
        forgotten = forget_behind_the_cursor(
            b,
            a,
            *[
                ("DELETE FROM artifacts WHERE sha256 = ?", (hashlib.sha256(body).hexdigest(),))
                for body in lost
            ],
        )
        assert forgotten == [1, 1, 1, 1]
        b = mesh.restart(1)
        mesh.wait_ready()
        assert wait_for(lambda: _holds(b, written), 60), status(b)["anti_entropy"]
        assert b.metric('kura_anti_entropy_repaired_total{kind="artifact"}') == 4
        _assert_served_and_stored(b, written)
    finally:
        if joiner is not None:
            joiner.stop()
        mesh.stop_all()
