"""kura.storage.object_store against a real SeaweedFS: round trips, listing, deletes, and how
each failure is classified (wrong secret, missing bucket, 503 SlowDown, 500, a hang, refused)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from kura.core.manifest import Manifest
from kura.storage.object_store import ObjectStore, ObjectStoreConfig, ObjectStoreError
from kura_harness.launch.seaweedfs import SeaweedFS
from tests.objectstore.faultproxy import FaultProxy


def store_for(
    server: SeaweedFS,
    bucket: str = "kura",
    *,
    secret: str | None = None,
    endpoint: str | None = None,
    timeout: float = 10.0,
) -> ObjectStore:
    env = server.env(bucket, "client-test")
    if secret is not None:
        env["AWS_SECRET_ACCESS_KEY"] = secret
    if endpoint is not None:
        env["AWS_ENDPOINT_URL"] = endpoint
    return ObjectStore(ObjectStoreConfig.from_env(env["KURA_OBJECT_STORE_URL"], env, timeout))


def manifest_of(data: bytes, namespace: str = "ns1") -> Manifest:
    sha = hashlib.sha256(data).hexdigest()
    return Manifest(
        sha[:64], "nx", namespace, "k", "application/octet-stream", len(data), sha, 1, 1
    )


async def read_all(store: ObjectStore, key: str) -> tuple[Manifest, bytes] | None:
    got = await store.get(key)
    if got is None:
        return None
    manifest, chunks = got
    return manifest, b"".join([c async for c in chunks])


@pytest.mark.parametrize("size", [0, 1000, 9 * 1024 * 1024])
async def test_round_trip_small_and_multipart(
    seaweedfs: SeaweedFS, tmp_path: Path, size: int
) -> None:
    store = store_for(seaweedfs)
    data = os.urandom(size)
    path = tmp_path / "body"
    path.write_bytes(data)
    m = manifest_of(data)
    key = store.key_of(m, "t1")
    with path.open("rb") as f:
        await store.put_file(key, m, f)
    got = await read_all(store, key)
    assert got is not None
    assert got[0] == m
    assert got[1] == data
    assert await store.head(key) is not None
    assert await store.stored_version_ms(key) == 1
    assert store.stats.requests_total[("put", "ok")] == 1


async def test_list_and_delete_prefix(seaweedfs: SeaweedFS) -> None:
    store = store_for(seaweedfs)
    for i in range(5):
        m = manifest_of(f"body {i}".encode(), "clean-me")
        await store.put_file(store.key_of(m, "t1"), m, f"body {i}".encode())
    keep = manifest_of(b"keep", "keep-me")
    await store.put_file(store.key_of(keep, "t1"), keep, b"keep")
    listed = [
        o
        async for page in store.list_prefix(store.namespace_prefix("t1", "clean-me"))
        for o in page
    ]
    assert len(listed) == 5
    assert all(o.last_modified is not None for o in listed)
    assert await store.delete_prefix(store.namespace_prefix("t1", "clean-me")) == 5
    assert [
        o
        async for page in store.list_prefix(store.namespace_prefix("t1", "clean-me"))
        for o in page
    ] == []
    assert await read_all(store, store.key_of(keep, "t1")) == (keep, b"keep")
    assert await store.get("t1/ns-clean-me/absent") is None
    assert store.stats.requests_total[("get", "not_found")] == 1


async def test_start_check_classifies_config_errors(seaweedfs: SeaweedFS) -> None:
    assert await store_for(seaweedfs).check() is None
    refused = await store_for(seaweedfs, secret="wrong-secret").check()
    assert refused is not None
    assert refused.result == "auth"
    missing = await store_for(seaweedfs, "no-such-bucket").check()
    assert missing is not None
    assert missing.result == "bucket_missing"
    assert "object store" in str(missing)


@pytest.mark.parametrize(
    ("mode", "result"),
    [
        ("slowdown", "throttled"),
        ("error500", "server_error"),
        ("hang", "timeout"),
        ("refuse", "unreachable"),
    ],
)
async def test_faults_are_classified(
    seaweedfs: SeaweedFS, fault_proxy: FaultProxy, mode: str, result: str
) -> None:
    store = store_for(seaweedfs, endpoint=fault_proxy.endpoint, timeout=2.0)
    m = manifest_of(b"through the proxy")
    await store.put_file(store.key_of(m, "t1"), m, b"through the proxy")  # pass mode works
    fault_proxy.set_mode(mode)
    with pytest.raises(ObjectStoreError) as caught:
        await store.put_file(store.key_of(m, "t1"), m, b"through the proxy")
    assert caught.value.result == result, str(caught.value)
    assert store.stats.requests_total[("put", result)] == 1
    fault_proxy.set_mode("pass")
    assert await read_all(store, store.key_of(m, "t1")) == (m, b"through the proxy")
