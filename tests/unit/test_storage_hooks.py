"""The storage hooks: ``NoHooks`` is a node on its own, and the mesh's ``MeshHooks`` acts like
it until ``connect`` and forwards to the given mesh callables after."""

from __future__ import annotations

import asyncio

from kura.mesh.storage_hooks import MeshHooks
from kura.storage.hooks import NoHooks, StorageHooks


def test_no_hooks_ship_to_nobody_fetch_nothing_and_hold_no_floor() -> None:
    hooks: StorageHooks = NoHooks()
    assert tuple(hooks.replication_targets()) == ()
    hooks.on_outbox_write()
    assert asyncio.run(hooks.fetch_missing("a" * 64, "")) is False
    assert hooks.eviction_floor_ms() is None


def test_mesh_hooks_forward_to_the_mesh_once_connected() -> None:
    hooks: StorageHooks
    hooks = mesh = MeshHooks()
    assert tuple(hooks.replication_targets()) == ()
    assert asyncio.run(hooks.fetch_missing("a" * 64, "")) is False
    assert hooks.eviction_floor_ms() is None

    woken: list[None] = []
    asked: list[str] = []

    async def fetch(artifact_id: str) -> bool:
        asked.append(artifact_id)
        return artifact_id.startswith("b")

    mesh.connect(
        targets=lambda: ("http://127.0.0.1:1",),
        wake=lambda: woken.append(None),
        fetch=fetch,
        floor_ms=lambda: 1234,
    )
    assert tuple(hooks.replication_targets()) == ("http://127.0.0.1:1",)
    hooks.on_outbox_write()
    assert woken == [None]
    assert asyncio.run(hooks.fetch_missing("b" * 64, "")) is True
    assert asyncio.run(hooks.fetch_missing("c" * 64, "")) is False
    assert asked == ["b" * 64, "c" * 64]
    assert hooks.eviction_floor_ms() == 1234


def test_mesh_hooks_without_read_through_fetch_nothing() -> None:
    mesh = MeshHooks()
    mesh.connect(targets=tuple, wake=lambda: None, fetch=None, floor_ms=lambda: None)
    assert asyncio.run(mesh.fetch_missing("b" * 64, "")) is False
