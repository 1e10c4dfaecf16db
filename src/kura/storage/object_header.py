"""The format of a kura object in the bucket: a self-describing body.

Each object is the line ``kura-object 1 <n>\\n``, then ``n`` bytes of the manifest as JSON
(``Manifest.to_json``), then the artifact's bytes. The manifest travels in the body rather than
in ``x-amz-meta-*`` headers because S3 caps user metadata at 2 KB
(https://docs.aws.amazon.com/AmazonS3/latest/userguide/UsingMetadata.html) and a manifest with
stored headers can be larger.

``encode_body`` builds a PUT's payload, ``decode_body`` splits a GET's stream (the client in
``storage.object_store`` sends and counts the requests).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import BinaryIO

from kit.thread_calls import finished_in_thread
from kura.core.manifest import Manifest

MAGIC = b"kura-object 1 "
MAX_HEADER_BYTES = 1024 * 1024
# Bodies up to this size are uploaded in one PUT from memory, larger ones as a multipart upload.
SINGLE_PUT_BYTES = 8 * 1024 * 1024
READ_CHUNK_BYTES = 1024 * 1024


def encode_header(manifest: Manifest) -> bytes:
    data = json.dumps(manifest.to_json(), separators=(",", ":"), sort_keys=True).encode()
    return MAGIC + str(len(data)).encode() + b"\n" + data


async def encode_body(manifest: Manifest, body: bytes | BinaryIO) -> bytes | AsyncIterator[bytes]:
    """The object for ``manifest`` and ``body`` (bytes, or an open file read from its start):
    bytes when it is sent in one PUT (up to ``SINGLE_PUT_BYTES`` of artifact), else an iterator
    of chunks of at most ``READ_CHUNK_BYTES`` for a multipart upload. Reads of the file run in
    a thread; OSError as the file raises it."""
    header = encode_header(manifest)
    if isinstance(body, bytes):
        return header + body
    if manifest.size <= SINGLE_PUT_BYTES:
        return header + await finished_in_thread(asyncio.to_thread(_read_all, body))
    return _file_chunks(header, body)


async def decode_header(chunks: AsyncIterator[bytes]) -> tuple[Manifest, bytes]:
    """The manifest at the start of ``chunks`` and the bytes after it. ValueError if absent."""
    buf = b""
    while True:
        newline = buf.find(b"\n")
        if newline >= 0:
            if not buf.startswith(MAGIC):
                raise ValueError("no kura-object header")
            length = int(buf[len(MAGIC) : newline])
            if not 0 < length <= MAX_HEADER_BYTES:
                raise ValueError(f"header length {length} out of range")
            end = newline + 1 + length
            while len(buf) < end:
                more = await anext(chunks, None)
                if more is None:
                    raise ValueError("object ends inside its header")
                buf += more
            return Manifest.from_text(buf[newline + 1 : end]), buf[end:]
        if len(buf) > 64:
            raise ValueError("no kura-object header")
        more = await anext(chunks, None)
        if more is None:
            raise ValueError("object ends inside its header")
        buf += more


async def decode_body(chunks: AsyncIterator[bytes]) -> tuple[Manifest, AsyncIterator[bytes]]:
    """The manifest at the start of ``chunks`` and an iterator over exactly the artifact's
    bytes after it. ValueError if there is no header (``decode_header``)."""
    manifest, rest = await decode_header(chunks)
    return manifest, _prepend(rest, chunks)


async def _prepend(first: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    if first:
        yield first
    async for chunk in rest:
        yield chunk


def _read_all(f: BinaryIO) -> bytes:
    f.seek(0)
    return f.read()


async def _file_chunks(header: bytes, f: BinaryIO) -> AsyncIterator[bytes]:
    yield header
    await finished_in_thread(asyncio.to_thread(f.seek, 0))
    while chunk := await finished_in_thread(asyncio.to_thread(f.read, READ_CHUNK_BYTES)):
        yield chunk
