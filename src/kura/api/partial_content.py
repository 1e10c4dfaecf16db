"""Range requests on artifact GETs: 200, 206 or 416 (RFC 9110 §14, ``kura.core.byte_range``).

Every public route that serves a stored artifact answers through ``ranged_response``. Its 200s
and 206s carry ``Accept-Ranges: bytes`` and a strong ``ETag`` (the artifact's SHA-256 in
quotes), so a client can resume with ``If-Range``; a ``Range`` it cannot or will not honour
(invalid, multi-range, another unit, a non-matching ``If-Range``) gets the full 200. A single
satisfiable range gets 206 with ``Content-Range: bytes a-b/size`` and exactly those bytes; an
unsatisfiable one gets 416 with ``Content-Range: bytes */size``. HEAD answers exactly like GET
(same status and headers) without a body: RFC 9110 §9.3.2 asks HEAD to show what the GET would
send, and §14.2 defines ranges for GET only, so a HEAD with ``Range`` previews that GET's 206 or
416 (as nginx does).

Integrity: a 206 is never sent from bytes that were not verified. The 200 path hashes a large
blob while it is sent and holds its last bytes back until the digest matched
(``kura.api.file_response``); a range cannot do that, because the digest covers the whole
file and the range may end anywhere. So before a 206 of a file-backed blob that storage did not
already verify (``StoredBody.verified`` is False: the ``KURA_VERIFY_READS=always`` default with
an unchanged stat signature), the bytes are checked in the verify pool first, and only then is
the range sent with ``sendfile`` from the same open descriptor:

* the first range of a content hashes the whole file (``storage.verify.digest_fd``, against the
  row's XXH3-128, else SHA-256) and, in the same pass, the XXH3-128 of each 1 MiB block, which
  are kept (``storage.verify.BlockDigests``, by content SHA-256 and size, 8 MiB of digests);
* a later range of the same content hashes only the blocks it touches against those
  (``storage.verify.problem_with_blocks``): a 1-byte range of a 512 MiB blob hashed all of it
  on every request before issue 26, now 1 MiB. Block digests are kept only after the whole file
  matched the row, so a damaged block is caught as a whole-file hash would catch it; what can
  still be sent from a damaged file is a range of its intact blocks, never a wrong byte.

A file whose stat signature changed was already hashed with SHA-256 by storage when it was
opened; with ``KURA_VERIFY_READS=changed`` an unchanged signature is trusted, as for a 200. On a
mismatch (or a read error) the entry is reported to storage, which re-checks it with SHA-256 and
quarantines it, and the request gets 404 like any miss; nothing of the damaged bytes is sent. A
file that turns out shorter while the range is sent aborts the connection (``DamagedBlob``), as
for a 200.

A matching ``If-None-Match`` gets 304 before any range is looked at (``kura.core.conditional``).
Not here: ``If-Match``/``If-Modified-Since`` (kura sends no Last-Modified), and
``multipart/byteranges``.

The price is one whole-file hash for the first range of a large blob in each process: about 0.4 s
for 1 GiB on the loaded test machine (docs/benchmarks.md, "Range requests").
"""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import Future

import aiohttp
from aiohttp import web

from kura.api.file_response import OpenFileResponse, report, send_file
from kura.api.http import artifact_response, count_bytes_out, ctx
from kura.core.byte_range import (
    FULL,
    UNSATISFIABLE,
    ByteRange,
    choose,
    strong_etag,
    unsatisfied_content_range,
)
from kura.core.conditional import none_match
from kura.core.errors import NotFound
from kura.storage.artifact import StoredBody
from kura.storage.checksum import SHA256, XXH3_128
from kura.storage.ports import ArtifactReader
from kura.storage.verify import problem_with_blocks


async def ranged_response(
    request: web.Request,
    body: StoredBody,
    protocol: str,
    *,
    extra_headers: dict[str, str] | None = None,
) -> web.StreamResponse:
    """The 200, 206 or 416 for a GET or HEAD of ``body`` (module docstring). Takes ownership of
    ``body`` (closes its file). Raises ``NotFound`` when the whole-file check before a 206
    finds the blob damaged (the entry is then reported and quarantined)."""
    size = body.manifest.size
    etag = strong_etag(body.manifest.sha256)
    headers = {"Accept-Ranges": "bytes", "ETag": etag, **(extra_headers or {})}
    asked = request.headers
    # Each field is looked at only when present: most GETs carry neither (an absent field
    # matches nothing, as an empty list of them does: ``none_match``, ``choose``).
    if "If-None-Match" in asked and none_match(asked.getall("If-None-Match"), etag):
        body.close()
        return web.Response(status=304, headers=headers)
    ranges = asked.getall("Range", ())
    if not ranges:
        return artifact_response(request, body, protocol, extra_headers=headers)
    # Two Range fields are no valid single range (§5.3 would join them into a list).
    answer = choose(ranges[0] if len(ranges) == 1 else None, asked.get("If-Range"), size, etag)
    if answer == FULL:
        return artifact_response(request, body, protocol, extra_headers=headers)
    if answer == UNSATISFIABLE:
        body.close()
        return web.Response(
            status=416,
            text="range not satisfiable",
            headers={"Accept-Ranges": "bytes", "Content-Range": unsatisfied_content_range(size)},
        )
    assert isinstance(answer, ByteRange)
    service = ctx(request).reader
    try:
        await _verify_range(service, body, answer)
    except BaseException:
        body.close()
        raise
    headers["Content-Type"] = body.manifest.content_type or "application/octet-stream"
    headers["Content-Range"] = answer.content_range
    count_bytes_out(request, protocol, answer.length_bytes)
    if body.data is not None:
        part = body.data[answer.first : answer.last + 1]
        return web.Response(status=206, body=part, headers=headers)
    return RangeFileResponse(body, answer, headers, service)


async def _verify_range(service: ArtifactReader, body: StoredBody, byte_range: ByteRange) -> None:
    """Check the bytes of ``byte_range`` of ``body``'s file unless storage already verified it:
    only the blocks it touches when the content's block digests are known, else the whole file
    (keeping its block digests). Raise ``NotFound`` (after reporting the entry) when the file is
    short, unreadable or hashes to something else."""
    if body.file is None or body.verified:
        return
    size = body.manifest.size
    known = service.verifier.blocks.get(body.manifest.sha256, size)
    if known is not None:
        check: Future[str | None] = service.verifier.pool.submit(
            problem_with_blocks,
            os.dup(body.file.fileno()),
            byte_range.first,
            byte_range.last,
            known,
        )
        found = await asyncio.wrap_future(check)
        if found is None:
            return
        service.verifier.blocks.forget(body.manifest.sha256, size)
    else:
        found = await _verify_whole_file(service, body)
        if found is None:
            return
    await report(service, body, found)
    raise NotFound("Artifact not found")


async def _verify_whole_file(service: ArtifactReader, body: StoredBody) -> str | None:
    """What is wrong with ``body``'s whole file (None: intact, and ``body.verified`` is set and
    its block digests kept)."""
    assert body.file is not None
    size = body.manifest.size
    fast = body.xxh3_128
    algorithms = (XXH3_128,) if fast else (SHA256, XXH3_128)
    # Shared with concurrent requests for the same file (storage.verify.ReadVerifier.digest).
    share = service.verifier.digest(body.file.fileno(), size, 0, algorithms, blocks=True)
    try:
        d = await share.result()
    except OSError as exc:
        return f"hashing the file failed: {exc}"
    finally:
        share.leave()
    if d.size_bytes < size:
        return f"the file ended after {d.size_bytes} of {size} bytes"
    if fast and d.digests[XXH3_128] != fast:
        return f"the file hashes to xxh3_128 {d.digests[XXH3_128]}"
    if not fast and d.sha256 != body.manifest.sha256:
        return f"the file hashes to sha256 {d.sha256}"
    if not fast:
        service.record_xxh3_128([(body.manifest, d.digests[XXH3_128])])
    body.verified = True
    service.verifier.blocks.put(body.manifest.sha256, size, share.blocks)
    return None


class RangeFileResponse(OpenFileResponse):
    """206 with one byte range of an already-open blob file whose range was verified
    (``_verify_range``), sent with sendfile."""

    def __init__(
        self,
        body: StoredBody,
        byte_range: ByteRange,
        headers: dict[str, str],
        service: ArtifactReader,
    ) -> None:
        super().__init__(body, headers, service)
        self.set_status(206)
        self.content_length = byte_range.length_bytes
        self._range = byte_range

    async def _send(
        self, writer: aiohttp.abc.AbstractStreamWriter, transport: asyncio.Transport
    ) -> None:
        f = self._stored.file
        assert f is not None
        first, length = self._range.first, self._range.length_bytes
        await writer.drain()
        try:
            sent = await send_file(writer, transport, f, first, length)
        except ConnectionError:
            raise  # the client went away
        except OSError as exc:  # EIO and friends: the disk, not the client
            await self._fail(transport, f"reading the file failed: {exc}")
        if sent < length:
            await self._fail(transport, f"the file ended {length - sent} bytes before the range")
