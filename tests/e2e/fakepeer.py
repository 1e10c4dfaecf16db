"""A faulty peer for the bootstrap tests.

TEST DOUBLE: a real kura peer verifies every body against its digest before serving it, so no
real node can be made to send a body longer than its manifest. This double speaks the internal
wire protocol exactly as ``kura.api.internal`` does (``/_internal/status``, cursor-paged
``manifests`` and ``namespace_tombstones``, ``artifacts/{id}`` with ``Kura-Manifest``, and with
``batches=True`` the framed ``bodies`` batch route) but serves bodies that the test scripts: some
honest, some chunked and longer than declared, some of the right length with the wrong bytes.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import time
from dataclasses import dataclass

from aiohttp import web

from kura.core.keys import artifact_id
from kura.core.manifest import Manifest
from kura.mesh.wire import encode_absent, encode_frame


@dataclass
class FakeArtifact:
    manifest: Manifest
    body: bytes  # what is actually sent (may differ from what the manifest says)


def honest(key: str, data: bytes, version_ms: int | None = None) -> FakeArtifact:
    return lying(key, data, data, version_ms)


def lying(key: str, claimed: bytes, sent: bytes, version_ms: int | None = None) -> FakeArtifact:
    """``version_ms`` defaults to now: a node refuses versions far ahead of its clock."""
    if version_ms is None:
        version_ms = time.time_ns() // 1_000_000
    m = Manifest(
        artifact_id=artifact_id("http", "default", "", key),
        producer="http",
        namespace_id="",
        key=key,
        content_type="application/octet-stream",
        size=len(claimed),
        sha256=hashlib.sha256(claimed).hexdigest(),
        version_ms=version_ms,
        created_at_ms=version_ms,
    )
    return FakeArtifact(m, sent)


class FakePeer:
    """Runs the double on 127.0.0.1 in a background thread. ``url`` is its internal URL."""

    def __init__(
        self,
        artifacts: list[FakeArtifact],
        chunk_delay: float = 0.005,
        batches: bool = False,
        unlisted: list[FakeArtifact] | None = None,
    ) -> None:
        self.artifacts = {a.manifest.artifact_id: a for a in artifacts}
        # Served by id but not listed to a bootstrap: what a peer stored after it (read-through).
        self.unlisted = {a.manifest.artifact_id: a for a in unlisted or []}
        self.chunk_delay = chunk_delay
        self.batches = batches  # serve POST /_internal/bootstrap/bodies (else 405, an old peer)
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._runner: web.AppRunner | None = None

    def _app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/_internal/status", self._status)
        app.router.add_get("/_internal/bootstrap/manifests", self._manifests)
        app.router.add_get("/_internal/bootstrap/namespace_tombstones", self._tombstones)
        app.router.add_get("/_internal/bootstrap/artifacts/{aid}", self._artifact)
        if self.batches:
            app.router.add_post("/_internal/bootstrap/bodies", self._bodies)
        return app

    async def _bodies(self, request: web.Request) -> web.Response:
        """Frames as ``kura.api.internal_batch`` sends them, but with the scripted bytes."""
        frames = []
        for aid in (await request.json())["artifact_ids"]:
            art = self.artifacts.get(aid)
            if art is None:
                frames.append(encode_absent(aid, "missing"))
            else:
                frames.append(encode_frame(art.manifest, art.body))
        return web.Response(body=b"".join(frames))

    async def _status(self, request: web.Request) -> web.Response:
        return web.json_response({"region": "fake", "tenant_id": "default", "node_url": self.url})

    async def _manifests(self, request: web.Request) -> web.Response:
        after = request.query.get("after", "")
        limit = int(request.query.get("limit", "256"))
        ids = sorted(a for a in self.artifacts if a > after)
        page = ids[:limit]
        return web.json_response(
            {
                "manifests": [self.artifacts[a].manifest.to_json() for a in page],
                "next_after": page[-1] if len(ids) > limit else None,
            }
        )

    async def _tombstones(self, request: web.Request) -> web.Response:
        return web.json_response({"tombstones": [], "next_after": None})

    async def _artifact(self, request: web.Request) -> web.StreamResponse:
        aid = request.match_info["aid"]
        art = self.artifacts.get(aid) or self.unlisted.get(aid)
        if art is None:
            return web.json_response({"message": "Artifact not found"}, status=404)
        resp = web.StreamResponse(headers={"Kura-Manifest": json.dumps(art.manifest.to_json())})
        resp.enable_chunked_encoding()  # no Content-Length: only the manifest says the size
        await resp.prepare(request)
        for i in range(0, len(art.body), 64 * 1024):
            await resp.write(art.body[i : i + 64 * 1024])
            await asyncio.sleep(self.chunk_delay)
        await resp.write_eof()
        return resp

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def start() -> None:
            self._runner = web.AppRunner(self._app())
            await self._runner.setup()
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            await site.start()
            port = self._runner.addresses[0][1]
            self.url = f"http://127.0.0.1:{port}"
            self._ready.set()

        self._loop.run_until_complete(start())
        self._loop.run_forever()

    def __enter__(self) -> FakePeer:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            if self._runner is not None:
                await self._runner.cleanup()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
