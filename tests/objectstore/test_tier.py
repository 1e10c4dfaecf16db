"""The object-storage tier end to end: real ``kura serve`` processes on a real SeaweedFS.

A write is acknowledged once it is on local disk and its upload is queued in the durable
outbox; the uploader puts it in the bucket; a second node sharing the bucket, with an empty
disk and no bootstrap, is ready at once and serves it by filling from the bucket; a clean
deletes the namespace's objects in the bucket; a missing bucket or a wrong secret stops
``kura serve`` at start with a clear message and a non-zero exit.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import httpx
import obstore
from obstore.store import S3Store

from kura.core.keys import artifact_id
from kura.core.object_layout import namespace_prefix, parse_url
from kura.storage.object_store import ObjectStore, ObjectStoreConfig
from kura_harness.launch.seaweedfs import SeaweedFS
from tests import oneshot
from tests.conftest import NodeProcess, spawn_node
from tests.e2e.mesh import free_port, peer_row, wait_for
from tests.objectstore.conftest import TierNode, get, put, start_failure, tier_env, tier_metric
from tests.objectstore.faultproxy import FaultProxy

QUEUE = "kura_object_store_upload_queue_messages"
REQUESTS = "kura_object_store_requests_total"


def uploads(node: NodeProcess) -> float:
    return tier_metric(node, REQUESTS, op="put", result="ok")


def drained(node: NodeProcess, after: float = 0) -> bool:
    """The upload queue is empty and more than ``after`` uploads succeeded: for a node that
    uploaded before, ``after`` is the count taken before the write waited for, so an upload
    of that write (not only an empty queue) is what ends the wait."""
    return tier_metric(node, QUEUE) == 0 and uploads(node) > after


def bucket_keys(server: SeaweedFS, prefix: str, under: str = "") -> list[str]:
    """The keys in bucket ``kura`` under ``prefix``/``under``, read with kura's own client."""
    env = server.env("kura", prefix)
    store = ObjectStore(ObjectStoreConfig.from_env(env["KURA_OBJECT_STORE_URL"], env, 10))

    async def keys() -> list[str]:
        return [o.key async for page in store.list_prefix(under) for o in page]

    return asyncio.run(keys())


def test_a_write_reaches_the_bucket_once_and_a_fresh_node_serves_it_at_once(
    seaweedfs: SeaweedFS, tier_node: TierNode
) -> None:
    a = tier_node("a", prefix="fresh")
    bodies = {f"k{i}": os.urandom(1000 + i * 70_000) for i in range(5)}  # 1 KB .. 281 KB
    for key, body in bodies.items():
        assert put(a, key, body) in (200, 201)
    assert wait_for(lambda: drained(a), 30), a.log()[-2000:]
    keys = bucket_keys(seaweedfs, "fresh", namespace_prefix("default", ""))
    assert len(keys) == len(bodies)
    # Once each (plus the start check's empty probe object).
    assert tier_metric(a, REQUESTS, op="put", result="ok") == len(bodies) + 1
    assert tier_metric(a, "kura_object_store_uploaded_bytes_total") == sum(
        map(len, bodies.values())
    )

    b = tier_node("b", prefix="fresh")  # empty disk, same bucket, not a peer of a
    assert oneshot.get(b.url + "/ready", timeout=10).status_code == 200
    assert b.index_rows() == 0
    for key, body in bodies.items():
        r = get(b, key)
        assert r.status_code == 200, (key, r.text)
        assert hashlib.sha256(r.content).hexdigest() == hashlib.sha256(body).hexdigest()
    assert b.index_rows() == len(bodies)  # filled into its local tier
    assert tier_metric(b, "kura_object_store_filled_bytes_total") == sum(map(len, bodies.values()))
    assert get(b, "never-written").status_code == 404
    assert tier_metric(b, REQUESTS, op="put", result="ok") == 1  # its probe: a fill never uploads
    assert b.staging_files() == []


def test_a_clean_deletes_the_namespace_in_the_bucket(
    seaweedfs: SeaweedFS, tier_node: TierNode
) -> None:
    a = tier_node("a", prefix="clean")
    for i in range(4):
        assert put(a, f"c{i}", f"clean me {i}".encode()) in (200, 201)
    assert wait_for(lambda: drained(a), 30)
    assert len(bucket_keys(seaweedfs, "clean")) == 4
    r = oneshot.delete(a.url + "/api/cache/clean", params={"tenant_id": "default"}, timeout=30)
    assert r.status_code == 204
    assert wait_for(lambda: tier_metric(a, QUEUE) == 0, 30)
    assert wait_for(lambda: tier_metric(a, REQUESTS, op="delete", result="ok") > 0, 30)
    assert bucket_keys(seaweedfs, "clean") == []
    b = tier_node("b", prefix="clean")
    assert get(b, "c0").status_code == 404
    # A write after the clean is stored and uploaded again.
    assert put(a, "c0", b"after the clean") in (200, 201)
    assert wait_for(lambda: tier_metric(a, QUEUE) == 0, 30)
    assert wait_for(lambda: get(b, "c0").status_code == 200, 30)
    assert get(b, "c0").content == b"after the clean"


def test_a_missing_bucket_stops_the_node_at_start(seaweedfs: SeaweedFS, tmp_path: Path) -> None:
    done = start_failure(seaweedfs, tmp_path / "n", bucket="no-such-bucket")
    assert done.returncode == 1, done.stderr
    assert "bucket 'no-such-bucket' does not exist" in done.stderr
    assert "kura listening" not in done.stdout


def test_a_wrong_secret_stops_the_node_at_start(seaweedfs: SeaweedFS, tmp_path: Path) -> None:
    done = start_failure(seaweedfs, tmp_path / "n", secret="not-the-secret")
    assert done.returncode == 1, done.stderr
    assert "credentials (AWS_ACCESS_KEY_ID=kura-test) were refused" in done.stderr
    assert "not-the-secret" not in done.stderr + done.stdout
    assert seaweedfs.secret_key not in done.stderr + done.stdout


def test_peers_sharing_a_bucket_copy_no_bodies_and_carry_cleans(tier_node: TierNode) -> None:
    ports = [free_port(), free_port()]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    a, b = (
        tier_node(name, prefix="mesh", internal_port=port, node_url=url, peers=",".join(urls))
        for name, port, url in zip(("a", "b"), ports, urls, strict=True)
    )
    assert wait_for(lambda: oneshot.get(b.url + "/ready").status_code == 200, 60)
    body = os.urandom(50_000)
    assert put(a, "shared", body) in (200, 201)
    assert wait_for(lambda: drained(a), 30)
    assert get(b, "shared").content == body  # filled from the bucket, not sent by a
    applied = "kura_replication_apply_results_total"
    replicated = tier_metric(b, applied, source="replication")  # bodies a sent b: none
    assert tier_metric(b, "kura_object_store_filled_bytes_total") == len(body)
    r = oneshot.delete(a.url + "/api/cache/clean", params={"tenant_id": "default"}, timeout=30)
    assert r.status_code == 204
    # The tombstone travels the mesh: b drops its local copy; the bucket's is deleted too.
    assert wait_for(lambda: get(b, "shared").status_code == 404, 30), b.log()[-2000:]
    assert bucket_keys_of(a) == []
    assert replicated == 0
    assert tier_metric(b, applied, source="replication_tombstone", outcome="applied") == 1


def test_a_peer_forgotten_while_a_namespace_was_cleaned_gets_the_clean_when_it_returns(
    tier_node: TierNode,
) -> None:
    """B holds an artifact on its disk and is down while A forgets it
    (``KURA_PEER_FORGET_AFTER=1s``) and cleans the namespace: nothing is queued or in flight
    for B. No pull and no anti-entropy run with the tier, so once B is back A re-offers it the
    tombstones since its mark: B answers 404 within seconds and A's mark is cleared. Without
    the re-offer B serves the cleaned artifact from its disk forever."""
    ports = [free_port(), free_port()]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    common = {
        "prefix": "forget",
        "peers": ",".join(urls),
        "peer_forget_after": "1s",
        "discovery_settle_ms": 0,
        "discovery_interval_ms": 500,
        "read_through": "never",  # B answers from its disk and the bucket only
    }
    a = tier_node("a", internal_port=ports[0], node_url=urls[0], **common)
    b = tier_node("b", internal_port=ports[1], node_url=urls[1], **common)
    assert wait_for(lambda: oneshot.get(b.url + "/ready").status_code == 200, 60)
    assert put(a, "cleaned", b"held by b " * 100) in (200, 201)
    assert wait_for(lambda: drained(a), 30)
    assert get(b, "cleaned").status_code == 200  # filled from the bucket onto B's disk
    # Forgotten after this stop: with a 1 s forget time, A may have forgotten B once already,
    # before discovery first saw it, and that mark is cleared once A sees B healthy; B may be
    # ready before A's discovery has seen it at all (it probes every 500 ms).
    assert wait_for(
        lambda: (
            (row := peer_row(a, urls[1])).get("healthy") is True
            and row.get("needs_catch_up") is False
        ),
        30,
    ), a.log()
    forgets = f"peer {urls[1]} absent for"
    before = a.log().count(forgets)
    assert b.stop() == 0
    assert wait_for(lambda: a.log().count(forgets) > before, 30), a.log()
    row = peer_row(a, urls[1])
    assert (row["forgotten_at"] is not None, row["healthy"]) == (True, False), row
    r = oneshot.delete(a.url + "/api/cache/clean", params={"tenant_id": "default"}, timeout=30)
    assert r.status_code == 204
    assert bucket_keys_of(a) == []
    assert peer_row(a, urls[1])["outbox_messages"] == 0, a.log()  # the clean was not queued for B
    b = tier_node("b", internal_port=ports[1], node_url=urls[1], **common)  # same disk
    assert wait_for(lambda: get(b, "cleaned").status_code == 404, 20), b.log()[-2000:]
    assert wait_for(lambda: peer_row(a, urls[1])["needs_catch_up"] is False, 20), a.log()
    assert f"{urls[1]} caught up by re-offering 1 namespace tombstones" in a.log()


def bucket_keys_of(node: NodeProcess) -> list[str]:
    """What the bucket holds under ``node``'s prefix, once its upload queue is empty."""
    assert wait_for(lambda: tier_metric(node, QUEUE) == 0, 30)
    env = node.env
    store = ObjectStore(ObjectStoreConfig.from_env(env["KURA_OBJECT_STORE_URL"], env, 10))

    async def keys() -> list[str]:
        return [o.key async for page in store.list_prefix("") for o in page]

    return [k for k in asyncio.run(keys()) if not k.startswith(".kura-start-check/")]


def test_a_store_unreachable_at_start_is_a_warning_and_writes_queue(
    seaweedfs: SeaweedFS, fault_proxy: FaultProxy, tier_node: TierNode
) -> None:
    fault_proxy.set_mode("refuse")
    a = tier_node("a", prefix="late", endpoint=fault_proxy.endpoint, object_store_timeout="2s")
    # The warning carries the store's own words, not only the class of failure.
    assert re.search(
        r"not usable at start \(object store \w+ failed \(unreachable\): .+\)", a.log()
    )
    assert oneshot.get(a.url + "/ready", timeout=10).status_code == 200
    assert put(a, "early", b"written while the store was unreachable") in (200, 201)
    assert get(a, "early").status_code == 200
    assert wait_for(lambda: tier_metric(a, QUEUE) == 1, 30)
    fault_proxy.set_mode("pass")
    assert wait_for(lambda: drained(a), 60), a.log()[-2000:]
    assert bucket_keys_of(a) == [namespace_prefix("default", "") + a_id(a)]


def a_id(node: NodeProcess) -> str:
    """The artifact id of the one artifact ``node`` holds."""
    conn = sqlite3.connect(f"file:{node.data_dir / 'index.sqlite3'}?mode=ro", uri=True)
    try:
        return str(conn.execute("SELECT artifact_id FROM artifacts").fetchone()[0])
    finally:
        conn.close()


def raw_store(server: SeaweedFS, prefix: str) -> S3Store:
    """Bucket ``kura`` under ``prefix`` through obstore, not kura's client: bytes as they are."""
    env = server.env("kura", prefix)
    return S3Store(
        "kura",
        prefix=parse_url(env["KURA_OBJECT_STORE_URL"])[1],  # the module's own, under it
        endpoint=env["AWS_ENDPOINT_URL"],
        region=env["AWS_REGION"],
        access_key_id=env["AWS_ACCESS_KEY_ID"],
        secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        client_options={"allow_http": True},
    )


def overwrite_raw(server: SeaweedFS, prefix: str, key: str, data: bytes) -> None:
    """Put ``data`` at ``key`` in bucket ``kura`` as it is (not in kura's format)."""
    obstore.put(raw_store(server, prefix), key, data)


def read_raw(server: SeaweedFS, prefix: str, key: str) -> bytes:
    """The object at ``key`` in bucket ``kura``, bytes as stored."""
    return bytes(obstore.get(raw_store(server, prefix), key).bytes())


def test_a_malformed_object_is_a_miss_and_the_next_write_or_clean_replaces_it(
    seaweedfs: SeaweedFS, tier_node: TierNode
) -> None:
    """The class: an object whose header is valid JSON but no manifest (``null``, ``[]``, a
    string) used to be a 500 on a fill and jammed the uploader, which reads the stored version
    before each upload, so no later write reached the bucket."""
    a = tier_node("a", prefix="poison")
    for i, header in enumerate((b"null", b"[]")):
        key = f"p{i}"
        before = uploads(a)
        assert put(a, key, b"first bytes") in (200, 201)
        assert wait_for(lambda before=before: drained(a, before), 30), a.log()[-2000:]
        [obj] = [k for k in bucket_keys(seaweedfs, "poison") if k.endswith(a_id_of(key))]
        overwrite_raw(seaweedfs, "poison", obj, b"kura-object 1 %d\n" % len(header) + header)
        fresh = tier_node(f"fresh{i}", prefix="poison")
        r = get(fresh, key)
        assert r.status_code == 404, (header, r.status_code, r.text)
        assert "Traceback" not in fresh.log()
        # The next write of the key replaces the malformed object; the queue drains.
        before = uploads(a)
        assert put(a, key, b"second bytes") in (200, 201)
        assert wait_for(lambda before=before: drained(a, before), 30), a.log()[-3000:]
        other = tier_node(f"other{i}", prefix="poison")
        assert get(other, key).content == b"second bytes"
    assert " ERROR " not in a.log(), a.log()[-3000:]
    # A clean deletes a malformed object of its namespace too.
    [obj] = [k for k in bucket_keys(seaweedfs, "poison") if k.endswith(a_id_of("p0"))]
    overwrite_raw(seaweedfs, "poison", obj, b"kura-object 1 4\nnull")
    assert oneshot.delete(a.url + "/cache", timeout=10).status_code == 204
    assert wait_for(
        lambda: not bucket_keys(seaweedfs, "poison", namespace_prefix("default", "")), 30
    )


def a_id_of(key: str) -> str:
    return artifact_id("http", "default", "", key)


def test_status_shows_the_store_and_no_bootstrap_on_a_tier_node(
    seaweedfs: SeaweedFS, tier_node: TierNode
) -> None:
    a = tier_node("a", prefix="status")
    assert put(a, "s1", b"status bytes") in (200, 201)
    assert wait_for(lambda: drained(a), 30), a.log()[-2000:]
    status = oneshot.get(a.url + "/status", timeout=10).json()
    assert status["bootstrap"] is None  # a tier node never bootstraps
    store = status["object_store"]
    assert store["store"].startswith(seaweedfs.env("kura", "status")["KURA_OBJECT_STORE_URL"])
    assert store["upload_queue_messages"] == 0
    shown = subprocess.run(
        [sys.executable, "-m", "kura.cli", "status", "--url", a.url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    assert f"object store {store['store']}: 0 uploads queued" in shown.stdout
    assert "bootstrap" not in shown.stdout


def test_while_start_up_reconciles_a_bucket_fill_is_503_and_a_cleaned_one_never_served(
    seaweedfs: SeaweedFS, tier_node: TierNode, tmp_path: Path
) -> None:
    """Local writes wait for the reconciliation (storage.startup_work), and the tombstones a
    fill is checked against are not all known yet: a fill then answers 503 + Retry-After
    with no body (a 404 would be wrong: the bucket has it), and stores it once the work is
    done. The review's reproduction: a namespace cleaned on this node, with an older copy
    still in the bucket, was served 200 while start-up ran (the body passed through) and 404
    after; it must never be served."""
    a = tier_node("a", prefix="startup")
    body = os.urandom(300_000)
    assert put(a, "held", body) in (200, 201)
    assert wait_for(lambda: drained(a), 30), a.log()[-2000:]
    [obj] = [k for k in bucket_keys(seaweedfs, "startup") if k.endswith(a_id_of("held"))]
    old_copy = read_raw(seaweedfs, "startup", obj)
    # A damaged object: the key of "other" holding "held". A logged miss during start-up too
    # (it was start-up's 503: the store's error is an Unavailable).
    overwrite_raw(seaweedfs, "startup", obj.replace(a_id_of("held"), a_id_of("other")), old_copy)
    directory = tmp_path / "b"
    env = tier_env(seaweedfs, directory, prefix="startup", startup_wait_seconds=1)
    env["KURA_FAILPOINTS"] = "startup.reconcile=sleep(15000)"  # held before its walk
    b = spawn_node(directory, env)
    try:
        assert assert_held_then(b, body, 200, misses=("other",)).content == body
        assert "holds another artifact" in b.log()
        assert b.index_rows() == 1  # stored once the work is done
        # A clean on this node; then an older copy reappears in the bucket (a peer's upload
        # queued before the clean reached it, say).
        assert oneshot.delete(b.url + "/cache", timeout=10).status_code == 204
        assert wait_for(
            lambda: not bucket_keys(seaweedfs, "startup", namespace_prefix("default", "")), 30
        )
        overwrite_raw(seaweedfs, "startup", obj, old_copy)
    finally:
        assert b.stop() == 0, b.log()[-3000:]
    b = spawn_node(directory, env)
    try:
        assert_held_then(b, body, 404)
        assert b.index_rows() == 0
    finally:
        assert b.stop() == 0, b.log()[-3000:]


def assert_held_then(
    node: NodeProcess, body: bytes, after: int, misses: tuple[str, ...] = ()
) -> httpx.Response:
    """While ``node``'s start-up work is held, ``held`` (in the bucket, not on its disk) is a
    503 with ``Retry-After`` and no body, and each of ``misses`` a 404, nothing stored; once
    ready, a GET of ``held`` answers ``after``."""
    assert wait_for(lambda: "checking the index" in node.log(), 10), node.log()
    assert oneshot.get(node.url + "/status", timeout=10).json()["startup"]["phase"] != "done"
    for key in misses:
        missed = get(node, key)
        assert missed.status_code == 404, missed.text
    r = get(node, "held")
    assert r.status_code == 503, r.text
    assert int(r.headers["Retry-After"]) >= 1
    assert "start-up" in r.text, r.text
    assert "object store" in r.text, r.text
    assert body not in r.content
    assert node.index_rows() == 0
    assert oneshot.get(node.url + "/status", timeout=10).json()["startup"]["phase"] != "done"
    assert wait_for(lambda: oneshot.get(node.url + "/ready", timeout=10).status_code == 200, 30)
    r = get(node, "held")
    assert r.status_code == after, r.text
    return r
