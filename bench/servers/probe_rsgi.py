"""The granian RSGI app ``bench/granian_probe.py`` asks what RSGI does for kura's needs.

PUT /reject        answers 401 without reading the body (an auth or size check failing)
PUT /accept        reads the whole body, answers 201 with its length
PUT /slow-read     reads the body chunk by chunk, 50 ms per chunk, answers 201 with its length
GET /flood/{mib}   ``response_stream``: {mib} x ``send_bytes`` of 1 MiB; records how long the
                   sending loop took and the worker's RSS before and after (GET /stats)
GET /file          ``response_file`` of ``PROBE_FILE`` (environment)
GET /short         ``response_stream`` promising 1 MiB, 512 KiB sent, then the app raises (what
                   kura does when a digest does not match: the client must not get a clean end)
GET /stats         JSON: the last flood's seconds, rss_kib_before, rss_kib_after; this worker's
                   pid and rss_kib now
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

LAST: dict[str, float] = {}


def rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


async def app(scope: Any, protocol: Any) -> None:
    path: str = scope.path
    if path == "/reject":
        protocol.response_bytes(401, [], b"no")
    elif path == "/accept":
        body = await protocol()
        protocol.response_bytes(201, [], str(len(body)).encode())
    elif path == "/slow-read":
        received = 0
        async for chunk in protocol:
            received += len(chunk)
            await asyncio.sleep(0.05)
        protocol.response_bytes(201, [], str(received).encode())
    elif path.startswith("/flood/"):
        mib = int(path[7:])
        chunk = b"x" * (1 << 20)
        headers = [("content-length", str(mib << 20))]
        before, t0 = rss_kib(), time.monotonic()
        transport = protocol.response_stream(200, headers)
        for _ in range(mib):
            await transport.send_bytes(chunk)
        LAST.update(seconds=time.monotonic() - t0, rss_kib_before=before, rss_kib_after=rss_kib())
    elif path == "/short":
        transport = protocol.response_stream(200, [("content-length", str(1 << 20))])
        await transport.send_bytes(b"x" * (1 << 19))
        await asyncio.sleep(0.2)
        raise RuntimeError("digest mismatch (probe)")
    elif path == "/file":
        protocol.response_file(200, [], os.environ["PROBE_FILE"])
    elif path == "/stats":
        now = {**LAST, "pid": os.getpid(), "rss_kib": rss_kib()}
        protocol.response_bytes(200, [], json.dumps(now).encode())
    else:
        protocol.response_empty(404, [])
