"""The bare aiohttp app of ``bench/stacks.py`` (nothing but the case in each handler).

GET /mem/{key}     the body from a dict (``web.Response``)
PUT /mem/{key}     the whole body read (``await request.read()``), stored in a dict, 201
GET /stream/{key}  the body from the dict, written in 64 KiB chunks (``StreamResponse``)
PUT /stream/{key}  the body read chunk by chunk (``iter_any``), counted, not kept, 201
GET /file/{key}    ``web.FileResponse`` of the seeded file (os.sendfile on asyncio's loop)

Seeded blobs: ``STACKS_ROOT`` (stacks_store.py). ``--processes N`` forks N processes before any
event loop exists, each binding the port with SO_REUSEPORT (as bench/servers/aiohttp_cache.py
and kura's KURA_WORKERS do).

Usage: STACKS_ROOT=DIR python stacks_aiohttp.py --port PORT [--processes N] [--uvloop]
"""

from __future__ import annotations

import argparse
import asyncio
import os

from aiohttp import web
from stacks_store import PUT_KEYS_MAX, STREAM_CHUNK_BYTES, load_blobs

OCTETS = {"Content-Type": "application/octet-stream"}


def make_app() -> web.Application:
    blobs, paths = load_blobs()
    stored: dict[str, bytes] = {}

    async def get_mem(request: web.Request) -> web.Response:
        body = blobs.get(request.match_info["key"])
        if body is None:
            raise web.HTTPNotFound()
        return web.Response(body=body, headers=OCTETS)

    async def put_mem(request: web.Request) -> web.Response:
        if len(stored) >= PUT_KEYS_MAX:
            stored.clear()
        stored[request.match_info["key"]] = await request.read()
        return web.Response(status=201)

    async def get_stream(request: web.Request) -> web.StreamResponse:
        body = blobs.get(request.match_info["key"])
        if body is None:
            raise web.HTTPNotFound()
        response = web.StreamResponse(headers=OCTETS)
        response.content_length = len(body)
        await response.prepare(request)
        view = memoryview(body)
        for start in range(0, len(body), STREAM_CHUNK_BYTES):
            await response.write(view[start : start + STREAM_CHUNK_BYTES])
        await response.write_eof()
        return response

    async def put_stream(request: web.Request) -> web.Response:
        received = 0
        async for chunk in request.content.iter_any():
            received += len(chunk)
        return web.Response(status=201)

    async def get_file(request: web.Request) -> web.StreamResponse:
        path = paths.get(request.match_info["key"])
        if path is None:
            raise web.HTTPNotFound()
        return web.FileResponse(path, chunk_size=1 << 20, headers=OCTETS)

    app = web.Application()
    app.router.add_get("/mem/{key}", get_mem, allow_head=False)
    app.router.add_put("/mem/{key}", put_mem)
    app.router.add_get("/stream/{key}", get_stream, allow_head=False)
    app.router.add_put("/stream/{key}", put_stream)
    app.router.add_get("/file/{key}", get_file, allow_head=False)
    return app


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--processes", type=int, default=1, help="processes on the port")
    ap.add_argument("--uvloop", action="store_true", help="uvloop instead of asyncio's loop")
    a = ap.parse_args()
    for _ in range(a.processes - 1):
        if os.fork() == 0:  # before any loop exists; the children die with the parent's group
            break
    if a.uvloop:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    web.run_app(
        make_app(),
        host=a.host,
        port=a.port,
        access_log=None,
        print=None,
        reuse_port=a.processes > 1,
    )


if __name__ == "__main__":
    main()
