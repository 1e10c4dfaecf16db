"""``POST /_internal/bootstrap/bodies``: many small artifacts in one response, for bootstrap.

A bootstrap of a million small artifacts that asks for each on its own spends its time in
per-request overhead on both sides. This route answers up to ``BATCH_MAX_IDS`` ids at once.
Request: JSON ``{"artifact_ids": ["<64 hex>", …]}``. Response: 200 with the frames of
``kura.mesh.wire.encode_frame`` in request order; every body is verified against its manifest
before it is sent (a damaged one is quarantined and reported ``missing``), and a body above
``BATCH_MAX_BODY_BYTES`` is reported ``large``. 400 for a malformed request. Peer-auth like
every ``/_internal/`` route; the bootstrap bandwidth limit and the peer pace
(``kura.mesh.peer_pace``) apply to the response.
"""

from __future__ import annotations

from aiohttp import web

from kura.api.http import ctx, endpoint, parse_json
from kura.api.internal import PROTOCOL, paced_write, serving_pace
from kura.core.errors import InvalidRequest
from kura.core.keys import HEX_SHA256, validate
from kura.mesh.wire import (
    BATCH_MAX_BODY_BYTES,
    BATCH_MAX_IDS,
    encode_absent,
    encode_frame,
)

REQUEST_MAX_BYTES = BATCH_MAX_IDS * 80 + 1024


@endpoint(PROTOCOL, None, body_limit=lambda _s: REQUEST_MAX_BYTES)
async def bodies(request: web.Request) -> web.StreamResponse:
    if request.content_length is None or request.content_length > REQUEST_MAX_BYTES:
        raise InvalidRequest(f"a Content-Length of at most {REQUEST_MAX_BYTES} bytes is required")
    doc = parse_json(await request.read())
    ids = doc.get("artifact_ids") if isinstance(doc, dict) else None
    if not isinstance(ids, list) or not 1 <= len(ids) <= BATCH_MAX_IDS:
        raise InvalidRequest(f"artifact_ids must be a list of 1 to {BATCH_MAX_IDS} ids")
    ids = [validate(str(a), HEX_SHA256, "artifact_id") for a in ids]
    c = ctx(request)
    frames: list[bytes] = []
    for aid, body in zip(ids, await c.reader.read_many(ids), strict=True):
        if body is None:
            frames.append(encode_absent(aid, "missing"))
        elif body.data is None or body.manifest.size > BATCH_MAX_BODY_BYTES:
            body.close()
            frames.append(encode_absent(aid, "large"))
        else:
            frames.append(encode_frame(body.manifest, body.data))
    payload = b"".join(frames)
    rate = c.settings.replication_bandwidth_limit_bytes_per_second
    pace = serving_pace(request)
    if pace is not None and not pace.slowing():
        await pace.acquire(len(payload))  # paid up front, then sent at once
        pace = None
    if rate <= 0 and pace is None:
        return web.Response(body=payload, content_type="application/octet-stream")
    response = web.StreamResponse(status=200)
    response.content_type = "application/octet-stream"
    response.content_length = len(payload)
    await response.prepare(request)
    await paced_write(response, [payload], rate, pace)
    await response.write_eof()
    return response


def routes() -> list[web.RouteDef]:
    return [web.post("/_internal/bootstrap/bodies", bodies)]
