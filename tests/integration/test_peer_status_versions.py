"""A peer's status whose wire version does not parse (a later release changed its format,
say to ``3.1``) is a peer this node cannot talk to, not a failed probe (``PeerClient.status``,
``kura.core.versions.UNPARSEABLE_WIRE_VERSION``; docs/upgrading.md).

The peer is a real HEAD node behind a front that rewrites the ``wire_version`` of its status
answer the way such a release would send it."""

from __future__ import annotations

from collections.abc import Callable

import aiohttp
from aiohttp import web

from kura.core.versions import UNPARSEABLE_WIRE_VERSION, speaks, unspoken_message
from kura.mesh.client import PeerClient
from tests.conftest import NodeProcess


async def test_a_status_with_an_unparseable_wire_version_is_an_unspoken_peer(
    start_node: Callable[..., NodeProcess],
) -> None:
    node = start_node()

    async def later_release(request: web.Request) -> web.Response:
        async with (
            aiohttp.ClientSession() as session,
            session.get(node.internal_url + "/_internal/status") as resp,
        ):
            doc = await resp.json()
        return web.json_response({**doc, "wire_version": "3.1", "kura_version": "0.4.0"})

    app = web.Application()
    app.router.add_get("/_internal/status", later_release)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    client = PeerClient("default", None)
    await client.start()
    try:
        seen = await client.status(f"http://{host}:{port}")
    finally:
        await client.close()
        await runner.cleanup()
    assert seen.wire_version == UNPARSEABLE_WIRE_VERSION
    assert seen.kura_version == "0.4.0"
    assert not speaks(seen.wire_version)
    assert unspoken_message(seen.wire_version, seen.kura_version).startswith(
        "kura 0.4.0 (unparseable wire version) and this node"
    )
    assert "finish the rollout to kura 0.4.0 or roll it back" in unspoken_message(
        seen.wire_version, seen.kura_version
    )


async def test_wire_version_0_parses_and_is_called_older_than_this_node_speaks(
    start_node: Callable[..., NodeProcess],
) -> None:
    """``0`` is a version number, below ``MIN_WIRE_VERSION``: older, never "unparseable", in a
    peer request's ``Kura-Wire-Version`` header and in a peer's status field alike."""
    node = start_node()
    async with (
        aiohttp.ClientSession() as session,
        session.get(
            node.internal_url + "/_internal/bootstrap/manifests",
            headers={"Kura-Wire-Version": "0"},
        ) as refused,
    ):
        assert refused.status == 503
        assert refused.headers["Kura-Refusal"] == "wire_version"
        message = (await refused.json())["message"]
    assert message.startswith("kura of unknown version (wire 0, older than this node speaks)")
    assert "unparseable" not in message
    assert "upgrade that node" in message

    async def old_wire(request: web.Request) -> web.Response:
        async with (
            aiohttp.ClientSession() as session,
            session.get(node.internal_url + "/_internal/status") as resp,
        ):
            doc = await resp.json()
        return web.json_response({**doc, "wire_version": "0", "kura_version": "0.0.9"})

    app = web.Application()
    app.router.add_get("/_internal/status", old_wire)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    client = PeerClient("default", None)
    await client.start()
    try:
        seen = await client.status(f"http://{host}:{port}")
    finally:
        await client.close()
        await runner.cleanup()
    assert seen.wire_version == 0
    assert not speaks(seen.wire_version)
    assert unspoken_message(seen.wire_version, seen.kura_version).startswith(
        "kura 0.0.9 (wire 0, older than this node speaks) and this node"
    )
