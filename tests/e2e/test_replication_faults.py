"""Replication never blocks on one bad copy, with real node processes (issue 10, deliverable 8).

* A copy the receiving peer refuses for good (507: larger than its whole disk budget) is dropped
  from the sender's queue, logged and counted (``kura_replication_dropped_total``); the writes
  behind it all arrive and the outbox drains (before: 15 of 300 later writes in 90 s).
* The tombstone of the tenant-wide namespace ``""`` is on the first bootstrap page, so a fresh
  node that bootstraps after a tenant-wide clean refuses an old copy of a ``""`` artifact.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests import oneshot
from tests.conftest import NodeProcess, node_env, spawn_node
from tests.e2e.mesh import manifests, status, wait_for
from tests.e2e.test_bootstrap import start_joiner

pytestmark = pytest.mark.in_process

MiB = 1024 * 1024
LATER_WRITES = 300


def test_a_copy_the_peer_refuses_for_good_is_dropped_and_the_queue_moves_on(
    start_node: Callable[..., NodeProcess], tmp_path: Path
) -> None:
    receiver = start_node("receiver", max_disk_bytes=MiB)
    env = node_env(tmp_path / "sender")
    env["KURA_PEERS"] = receiver.internal_url
    sender = spawn_node(tmp_path / "sender", env)
    try:
        assert wait_for(lambda: status(sender)["ready"] is True, 30), status(sender)
        too_big = os.urandom(2 * MiB)  # the receiver's whole disk budget is 1 MiB: 507
        with sender.client() as c:
            assert c.put("/v1/cache/toobig", content=too_big).status_code == 200
            for i in range(LATER_WRITES):
                assert c.put(f"/v1/cache/later{i:03d}", content=b"x%d" % i).status_code == 200
        started = time.monotonic()

        def arrived() -> int:
            return sum(1 for m in manifests(receiver).values() if m["key"].startswith("later"))

        assert wait_for(lambda: arrived() == LATER_WRITES, 60), f"{arrived()} arrived"
        took = time.monotonic() - started
        assert wait_for(lambda: status(sender)["outbox_messages"] == 0, 30), status(sender)
        peer = receiver.internal_url.split("://", 1)[1]
        dropped = f'kura_replication_dropped_total{{peer="{peer}",reason="insufficient_storage"}}'
        assert sender.metric(dropped) == 1, {
            k: v for k, v in sender.metrics().items() if "dropped" in k
        }
        result = f'kura_replication_requests_total{{operation="upsert_artifact",peer="{peer}",result="dropped"}}'
        assert sender.metric(result) == 1
        aid = next(a for a, m in manifests(sender).items() if m["key"] == "toobig")
        warning = re.search(
            rf"WARNING .*replication to \S+ dropped artifact {aid}.*507", sender.log()
        )
        assert warning, sender.log()[-3000:]
        assert all(m["key"] != "toobig" for m in manifests(receiver).values())
        print(f"{LATER_WRITES} later writes arrived {took:.1f} s after the last was written")
    finally:
        sender.stop()


def test_a_fresh_node_learns_the_tenant_wide_tombstone_when_it_bootstraps(
    start_node: Callable[..., NodeProcess], tmp_path: Path
) -> None:
    a = start_node("a")
    blob = b"a bazel CAS blob lives in the tenant-wide namespace"
    digest = hashlib.sha256(blob).hexdigest()
    with a.client() as c:
        assert c.put(f"/cache/cas/{digest}", content=blob).status_code == 200
    # The write as a peer would ship it: an old copy that may still arrive later.
    ((aid, manifest),) = manifests(a).items()
    assert manifest["namespace_id"] == ""
    stale = oneshot.get(f"{a.internal_url}/_internal/bootstrap/artifacts/{aid}")
    assert stale.status_code == 200
    with a.client() as c:
        assert c.delete("/api/cache/clean?tenant_id=t").status_code == 204  # namespace ""
        assert c.delete("/api/cache/clean?tenant_id=t&namespace_id=proj").status_code == 204
    # Paged one at a time: "" first, then "proj", then the end.
    seen, after = [], None
    while True:
        params = {"limit": "1"} if after is None else {"limit": "1", "after": after}
        page = oneshot.get(
            f"{a.internal_url}/_internal/bootstrap/namespace_tombstones", params=params
        )
        seen += [t["namespace_id"] for t in page.json()["tombstones"]]
        after = page.json()["next_after"]
        if after is None:
            break
    assert seen == ["", "proj"]

    fresh = start_joiner(tmp_path / "fresh", [a.internal_url])
    try:
        assert wait_for(lambda: status(fresh)["ready"] is True, 30), status(fresh)
        r = oneshot.put(
            f"{fresh.internal_url}/_internal/replicate/artifact",
            content=stale.content,
            headers={"Kura-Manifest": stale.headers["Kura-Manifest"]},
        )
        assert r.status_code == 204
        assert r.headers["Kura-Outcome"] == "ignored_tombstone"
        with fresh.client() as c:
            assert c.get(f"/cache/cas/{digest}").status_code == 404
        assert fresh.index_rows() == 0
    finally:
        fresh.stop()
