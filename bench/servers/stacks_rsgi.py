"""The bare granian RSGI app of ``bench/stacks.py`` (nothing but the case in each handler).

GET /mem/{key}     ``response_bytes`` of the body from a dict
PUT /mem/{key}     the whole body read (``await protocol()``), stored in a dict, 201
GET /stream/{key}  ``response_stream``: the body from the dict sent in 64 KiB ``send_bytes``
PUT /stream/{key}  the body read chunk by chunk (``async for chunk in protocol``), counted, 201
GET /file/{key}    ``response_file`` of the seeded file (granian reads and sends it in Rust)

Seeded blobs: ``STACKS_ROOT`` (stacks_store.py), loaded once per worker at import.

Usage: STACKS_ROOT=DIR granian --interface rsgi --working-dir bench/servers stacks_rsgi:app
"""

from __future__ import annotations

from typing import Any

from stacks_store import PUT_KEYS_MAX, STREAM_CHUNK_BYTES, load_blobs

BLOBS, PATHS = load_blobs()
STORED: dict[str, bytes] = {}
OCTETS = [("content-type", "application/octet-stream")]


async def app(scope: Any, protocol: Any) -> None:
    path: str = scope.path
    method: str = scope.method
    if path.startswith("/mem/"):
        key = path[5:]
        if method == "PUT":
            if len(STORED) >= PUT_KEYS_MAX:
                STORED.clear()
            STORED[key] = await protocol()
            protocol.response_empty(201, [])
            return
        body = BLOBS.get(key)
        if body is not None:
            protocol.response_bytes(200, OCTETS, body)
            return
    elif path.startswith("/stream/"):
        key = path[8:]
        if method == "PUT":
            received = 0
            async for chunk in protocol:
                received += len(chunk)
            protocol.response_empty(201, [])
            return
        body = BLOBS.get(key)
        if body is not None:
            transport = protocol.response_stream(200, [*OCTETS, ("content-length", str(len(body)))])
            view = memoryview(body)
            for start in range(0, len(body), STREAM_CHUNK_BYTES):
                await transport.send_bytes(bytes(view[start : start + STREAM_CHUNK_BYTES]))
            return
    elif path.startswith("/file/"):
        file = PATHS.get(path[6:])
        if file is not None:
            protocol.response_file(200, OCTETS, file)
            return
    protocol.response_empty(404, [])
