"""A peer's error body is quoted escaped in every ``PeerError`` (``kura.mesh.client.excerpt``):
its control characters, newlines and terminal escapes never reach logs, warnings or
``kura status`` as they are.

The client is kura's own; the peer is an HTTP server answering every internal route with an
error body holding such characters, as a broken or hostile peer could (no kura answers so)."""

from __future__ import annotations

import pytest
from aiohttp import web

from kura.core.manifest import Manifest
from kura.mesh.client import PeerClient, PeerError

HOSTILE = "\x1b[2J\x1b[31mFAKE: all good\r\nkura: second line\x07"


def _printable(message: str) -> bool:
    return message.isprintable() and "\x1b" not in message


async def test_an_error_body_with_control_characters_is_quoted_escaped() -> None:
    async def hostile(request: web.Request) -> web.Response:
        return web.Response(status=500, text=HOSTILE)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", hostile)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    url = f"http://{host}:{port}"
    client = PeerClient("default", None)
    await client.start()
    messages = []
    try:
        manifest = Manifest(
            artifact_id="a" * 64,
            producer="http",
            namespace_id="",
            key="k",
            content_type="application/octet-stream",
            size=1,
            sha256="0" * 64,
            version_ms=1,
            created_at_ms=1,
        )
        calls = (
            lambda: client.status(url),  # _get_json
            lambda: client.push_artifact(url, manifest, b"x"),  # replicate
            lambda: client.push_tombstone(url, "ns", 1),  # _send
            lambda: client.fetch_artifact(url, "a" * 64, 10),  # fetch
            lambda: client.manifests_page(url, None, 10),  # _get_json, counted
        )
        for call in calls:
            with pytest.raises(PeerError) as raised:
                await call()
            messages.append(str(raised.value))
    finally:
        await client.close()
        await runner.cleanup()
    for message in messages:
        assert "answered 500" in message, message
        assert _printable(message), repr(message)
        assert repr(HOSTILE) in message, message
