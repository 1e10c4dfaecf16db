"""Bucket objects a node could never get past (issue 26 item 10), on a real SeaweedFS.

* An object whose version lies a day ahead (left by a node whose clock ran ahead): no node
  can fill it (a version that far ahead is refused, ``KURA_MAX_CLOCK_SKEW_MS``), and on
  f8bb892 no write could replace it either (the uploader saw "a newer version is there" and
  skipped). A local write now replaces it, and a fresh node serves the new bytes.
* A CAS object damaged in the bucket: on f8bb892 a re-PUT to the node that holds the blob
  found it intact locally, stored nothing and uploaded nothing, so every other node kept
  missing it. The re-PUT now checks the bucket's copy and uploads the verified one.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time

from kura.core.keys import artifact_id
from kura.core.manifest import Manifest
from kura.core.object_layout import object_key
from kura.storage.object_header import encode_header
from kura.storage.object_store import ObjectStore, ObjectStoreConfig
from kura_harness.launch.seaweedfs import SeaweedFS
from tests.e2e.mesh import wait_for
from tests.objectstore.conftest import TierNode, get, put, tier_metric
from tests.objectstore.test_tier import overwrite_raw

QUEUE = "kura_object_store_upload_queue_messages"
DAY_MS = 86_400_000


def bucket_store(server: SeaweedFS, prefix: str) -> ObjectStore:
    env = server.env("kura", prefix)
    return ObjectStore(ObjectStoreConfig.from_env(env["KURA_OBJECT_STORE_URL"], env, 10))


async def stored_object(store: ObjectStore, key: str) -> bytes:
    """The object at ``key`` as stored: its header, then the artifact's bytes."""
    got = await store.get(key)
    assert got is not None
    manifest, chunks = got
    return encode_header(manifest) + b"".join([c async for c in chunks])


def test_a_far_future_object_in_the_bucket_is_replaced_by_a_local_write(
    seaweedfs: SeaweedFS, tier_node: TierNode
) -> None:
    aid = artifact_id("http", "default", "", "skewed")
    key = object_key("default", "", aid)
    old = b"written by a node whose clock ran a day ahead"
    now_ms = int(time.time() * 1000)
    ahead = Manifest(
        aid,
        "http",
        "",
        "skewed",
        "application/octet-stream",
        len(old),
        hashlib.sha256(old).hexdigest(),
        now_ms + DAY_MS,
        now_ms + DAY_MS,
    )
    asyncio.run(bucket_store(seaweedfs, "skew").put_file(key, ahead, old))
    a = tier_node("a", prefix="skew", max_clock_skew_ms=60_000)
    assert get(a, "skewed").status_code == 404  # it cannot be filled: a day is beyond the skew
    new = os.urandom(5000)
    assert put(a, "skewed", new) in (200, 201)
    assert wait_for(lambda: tier_metric(a, QUEUE) == 0, 30)

    b = tier_node("b", prefix="skew", max_clock_skew_ms=60_000)  # empty: fills from the bucket
    assert get(b, "skewed").content == new
    stored = asyncio.run(bucket_store(seaweedfs, "skew").stored_version_ms(key))
    assert stored is not None
    assert stored < now_ms + DAY_MS


def test_a_re_put_heals_a_cas_object_damaged_in_the_bucket(
    seaweedfs: SeaweedFS, tier_node: TierNode
) -> None:
    body = os.urandom(300_000)
    digest = hashlib.sha256(body).hexdigest()
    a = tier_node("a", prefix="heal")
    assert put(a, f"cas/{digest}", body) in (200, 201)
    assert wait_for(lambda: tier_metric(a, QUEUE) == 0, 30)
    aid = artifact_id("bazel", "default", "", f"cas/{digest}")
    key = object_key("default", "", aid)
    damaged = bytearray(asyncio.run(stored_object(bucket_store(seaweedfs, "heal"), key)))
    damaged[-1000] ^= 0xFF  # one byte of the body; the header still declares the good digest
    overwrite_raw(seaweedfs, "heal", key, bytes(damaged))

    b = tier_node("b", prefix="heal")
    assert get(b, f"cas/{digest}").status_code == 404  # the damaged copy is never served
    assert put(a, f"cas/{digest}", body) == 200  # the client sends it again to the holder
    assert wait_for(lambda: get(b, f"cas/{digest}").content == body, 30), a.log()[-3000:]
    assert "is damaged" in a.log()  # the holder said what it found and did
