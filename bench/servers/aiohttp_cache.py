"""Minimal aiohttp blob cache: the "well-written Python baseline".

GET/HEAD /cache/{key}  -> web.FileResponse (zero-copy os.sendfile on the default asyncio loop)
PUT      /cache/{key}  -> stream the body to a temp file in the store, then os.replace()

No fsync (same as nginx WebDAV and turborepo-remote-cache's local store).
Body writes are plain blocking writes from the event loop: they land in the
page cache and take microseconds, which is cheaper than a thread hop per chunk.

--hot: GETs of bodies up to 64 KiB are answered from a dict filled on first read (no check,
no eviction, no invalidation across processes: the least a Python server can do per small hit,
i.e. the ceiling for kura's hot cache). --processes N: N processes on the port (SO_REUSEPORT),
as kura's KURA_WORKERS.

Usage: python aiohttp_cache.py --port 8081 --root STORE_DIR [--host 127.0.0.1] [--uvloop]
       [--hot] [--processes N]
"""

import argparse
import asyncio
import contextlib
import os
import re
import tempfile

from aiohttp import web

KEY_RE = re.compile(r"^[0-9A-Za-z_-]{1,200}$")


HOT_MAX_BYTES = 64 * 1024


def make_app(root: str, hot: bool = False) -> web.Application:
    tmp_dir = os.path.join(root, ".tmp")
    os.makedirs(tmp_dir, exist_ok=True)

    def blob_path(request: web.Request) -> str:
        key = request.match_info["key"]
        if not KEY_RE.match(key):
            raise web.HTTPBadRequest(text="bad key")
        return os.path.join(root, key)

    memory: dict[str, bytes] = {}

    async def get_blob(request: web.Request) -> web.StreamResponse:
        path = blob_path(request)
        if hot:
            data = memory.get(path)
            if data is not None:
                return web.Response(body=data, content_type="application/octet-stream")
        try:
            size = os.stat(path).st_size
        except FileNotFoundError:
            raise web.HTTPNotFound() from None
        if hot and size <= HOT_MAX_BYTES:
            with open(path, "rb") as f:
                memory[path] = f.read()
            return web.Response(body=memory[path], content_type="application/octet-stream")
        return web.FileResponse(
            path,
            chunk_size=1 << 20,
            headers={"Content-Type": "application/octet-stream"},
        )

    async def put_blob(request: web.Request) -> web.Response:
        path = blob_path(request)
        fd, tmp = tempfile.mkstemp(dir=tmp_dir)
        try:
            with os.fdopen(fd, "wb", buffering=0) as f:
                async for chunk in request.content.iter_any():
                    f.write(chunk)
            os.replace(tmp, path)
            memory.pop(path, None)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        return web.Response(status=201)

    app = web.Application()
    app.router.add_get("/cache/{key}", get_blob)  # also registers HEAD
    app.router.add_put("/cache/{key}", put_blob)
    return app


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--root", required=True)
    ap.add_argument(
        "--uvloop",
        action="store_true",
        help="use uvloop (note: disables zero-copy sendfile in FileResponse)",
    )
    ap.add_argument("--hot", action="store_true", help="small GETs from memory (docstring)")
    ap.add_argument("--processes", type=int, default=1, help="processes on the port")
    a = ap.parse_args()
    if a.uvloop:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    os.makedirs(a.root, exist_ok=True)
    for _ in range(a.processes - 1):
        if os.fork() == 0:  # before any loop exists; the children die with the parent's group
            break
    web.run_app(
        make_app(a.root, a.hot),
        host=a.host,
        port=a.port,
        access_log=None,
        print=None,
        reuse_port=a.processes > 1,
    )


if __name__ == "__main__":
    main()
