"""The bare ASGI app of ``bench/stacks.py``, served by granian's ASGI interface and by uvicorn
(nothing but the case in each handler).

GET /mem/{key}     one ``http.response.body`` with the body from a dict
PUT /mem/{key}     the whole body received (every ``http.request`` message), stored, 201
GET /stream/{key}  the body from the dict in 64 KiB ``http.response.body`` messages
PUT /stream/{key}  the body received message by message, counted, not kept, 201
GET /file/{key}    ``http.response.pathsend`` where the server offers it (granian: the file is
                   read and sent by the server); else the file read and sent in 1 MiB messages
                   (uvicorn has no zero-copy file extension)

Seeded blobs: ``STACKS_ROOT`` (stacks_store.py), loaded once per worker at import.

Usage: STACKS_ROOT=DIR granian --interface asgi --working-dir bench/servers stacks_asgi:app
       STACKS_ROOT=DIR uvicorn --app-dir bench/servers stacks_asgi:app
"""

from __future__ import annotations

from typing import Any

from stacks_store import PUT_KEYS_MAX, STREAM_CHUNK_BYTES, load_blobs

BLOBS, PATHS = load_blobs()
STORED: dict[str, bytes] = {}
OCTETS = [(b"content-type", b"application/octet-stream")]
NOT_FOUND = {"type": "http.response.start", "status": 404, "headers": []}
CREATED = {"type": "http.response.start", "status": 201, "headers": []}
EMPTY = {"type": "http.response.body", "body": b""}
FILE_CHUNK_BYTES = 1 << 20


def _start(length: int) -> dict[str, Any]:
    headers = [*OCTETS, (b"content-length", b"%d" % length)]
    return {"type": "http.response.start", "status": 200, "headers": headers}


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":  # lifespan: nothing to set up
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        return
    path: str = scope["path"]
    method: str = scope["method"]
    if path.startswith("/mem/"):
        key = path[5:]
        if method == "PUT":
            parts = []
            more = True
            while more:
                message = await receive()
                parts.append(message.get("body", b""))
                more = message.get("more_body", False)
            if len(STORED) >= PUT_KEYS_MAX:
                STORED.clear()
            STORED[key] = b"".join(parts)
            await send(CREATED)
            await send(EMPTY)
            return
        body = BLOBS.get(key)
        if body is not None:
            await send(_start(len(body)))
            await send({"type": "http.response.body", "body": body})
            return
    elif path.startswith("/stream/"):
        key = path[8:]
        if method == "PUT":
            received = 0
            more = True
            while more:
                message = await receive()
                received += len(message.get("body", b""))
                more = message.get("more_body", False)
            await send(CREATED)
            await send(EMPTY)
            return
        body = BLOBS.get(key)
        if body is not None:
            await send(_start(len(body)))
            view = memoryview(body)
            last = len(body) - STREAM_CHUNK_BYTES
            for start in range(0, len(body), STREAM_CHUNK_BYTES):
                chunk = bytes(view[start : start + STREAM_CHUNK_BYTES])
                await send({"type": "http.response.body", "body": chunk, "more_body": start < last})
            return
    elif path.startswith("/file/"):
        file = PATHS.get(path[6:])
        if file is not None:
            await send(_start(len(BLOBS[path[6:]])))
            if "http.response.pathsend" in scope.get("extensions", {}):
                await send({"type": "http.response.pathsend", "path": file})
                return
            with open(file, "rb") as f:
                while chunk := f.read(FILE_CHUNK_BYTES):
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send(EMPTY)
            return
    await send(NOT_FOUND)
    await send(EMPTY)
