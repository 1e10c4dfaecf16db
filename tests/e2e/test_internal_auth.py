"""Peer credentials on the internal listener and the far-future version limit (issue 10).

Real ``kura serve`` processes on 127.0.0.1, real HTTP on their internal ports. Without (or with a
wrong) ``KURA_INTERNAL_TOKENS`` credential every ``/_internal/`` route answers 401 and nothing
changes; with it, a version far ahead of the receiver's clock is refused and nothing changes.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from kura.core.keys import artifact_id
from kura.core.manifest import Manifest
from kura.mesh.wire import encode_manifest
from tests import oneshot
from tests.conftest import NodeProcess, node_env, serve_refused
from tests.e2e.fakepeer import FakePeer, honest
from tests.e2e.mesh import Mesh, manifests, wait_for
from tests.e2e.test_mesh import make_ca, make_leaf, tls_client
from tests.integration.rawhttp import connect, read_response, send_head

pytestmark = pytest.mark.in_process

TOKEN = "peer-" + secrets.token_hex(16)
DAY_MS = 86_400_000
NAMESPACE = "team"
KEYS = [f"{i:02x}" * 8 for i in range(5)]  # Turborepo hashes


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def body_of(key: str) -> bytes:
    return f"real bytes of {key}\n".encode() * 50


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def turbo_manifest(key: str, data: bytes, version_ms: int, tag: str) -> Manifest:
    return Manifest(
        artifact_id=artifact_id("turbo", "default", NAMESPACE, key),
        producer="turbo",
        namespace_id=NAMESPACE,
        key=key,
        content_type="application/octet-stream",
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        version_ms=version_ms,
        created_at_ms=version_ms,
        headers={"x-artifact-tag": tag},
    )


def write_keys(node: NodeProcess) -> None:
    with node.client() as c:
        for key in KEYS:
            r = c.put(
                f"/v8/artifacts/{key}",
                params={"slug": NAMESPACE},
                content=body_of(key),
                headers={"x-artifact-tag": f"tag-{key}"},
            )
            assert r.status_code == 202, r.text


def assert_keys_served(node: NodeProcess) -> None:
    """Every key of the namespace answers 200 with its own bytes and its own tag."""
    with node.client() as c:
        for key in KEYS:
            r = c.get(f"/v8/artifacts/{key}", params={"slug": NAMESPACE})
            assert r.status_code == 200, (key, r.status_code, r.text)
            assert r.content == body_of(key)
            assert r.headers["x-artifact-tag"] == f"tag-{key}"


def snapshot(node: NodeProcess) -> dict[str, object]:
    """What a refused request must not change: rows, tombstones, blob files, staging, budget."""
    db = node.data_dir / "index.sqlite3"
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = sorted(
            conn.execute("SELECT artifact_id, version_ms, sha256, headers FROM artifacts")
        )
        tombstones = sorted(conn.execute("SELECT namespace_id, version_ms FROM tombstones"))
    finally:
        conn.close()
    blobs = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in node.blob_files()}
    return {
        "rows": rows,
        "tombstones": tombstones,
        "blobs": blobs,
        "staging": node.staging_files(),
        "tmp_reserved_bytes": node.metric("kura_tmp_reserved_bytes"),
    }


def internal_requests(forged_version_ms: int) -> list[tuple[str, str, dict[str, str], bytes]]:
    """(method, path, extra headers, body) for every /_internal/ route, each one that would
    change state if accepted: an overwrite and a new key with a forged tag, a tombstone."""
    evil = b"planted by an attacker"
    overwrite = turbo_manifest(KEYS[0], evil, forged_version_ms, "forged")
    new_key = turbo_manifest("ff" * 8, evil, forged_version_ms, "forged")
    aid = artifact_id("turbo", "default", NAMESPACE, KEYS[1])
    requests = [
        (m, "/_internal/replicate/artifact", {"Kura-Manifest": encode_manifest(man)}, evil)
        for m, man in (("PUT", overwrite), ("PUT", new_key))
    ]
    requests += [
        (
            "DELETE",
            f"/_internal/replicate/namespace?namespace_id={NAMESPACE}&version_ms={forged_version_ms}",
            {},
            b"",
        ),
        ("GET", "/_internal/status", {}, b""),
        ("GET", "/_internal/bootstrap/manifests?after=&limit=10", {}, b""),
        ("GET", "/_internal/bootstrap/namespace_tombstones?after=&limit=10", {}, b""),
        ("GET", f"/_internal/bootstrap/artifacts/{aid}", {}, b""),
        ("HEAD", f"/_internal/bootstrap/artifacts/{aid}", {}, b""),
        (
            "POST",
            "/_internal/bootstrap/bodies",
            {"Content-Type": "application/json"},
            json.dumps({"artifact_ids": [aid]}).encode(),
        ),
        ("GET", "/_internal/anti_entropy/digests?prefix=&depth=2", {}, b""),
        ("GET", f"/_internal/anti_entropy/range?prefix={aid[:2]}", {}, b""),
        ("POST", "/_internal/changes/pull", {"Kura-Node": "http://127.0.0.1:1"}, b""),
    ]
    return requests


WRONG_CREDENTIALS: list[dict[str, str]] = [
    {},  # none at all
    {"Authorization": "Bearer wrong-token"},
    {"Authorization": f"Bearer {TOKEN}x"},  # a prefix match is not a match
    {"Authorization": f"Bearer {TOKEN[:-1]}"},
    {"Authorization": "Basic " + base64.b64encode(f"kura:{TOKEN}".encode()).decode()},
    {"Authorization": TOKEN},  # no scheme
]


def test_every_internal_route_refuses_missing_or_wrong_peer_credentials_and_nothing_changes(
    start_node: Callable[..., NodeProcess],
) -> None:
    node = start_node(internal_tokens=f"{TOKEN},next-{TOKEN}")
    write_keys(node)
    before = snapshot(node)
    refused = 0
    with httpx.Client(base_url=node.internal_url, timeout=10) as c:
        for credentials in WRONG_CREDENTIALS:
            # A newer version than anything stored: if accepted, it would apply.
            for method, path, headers, body in internal_requests(now_ms() + 1000):
                r = c.request(method, path, headers={**headers, **credentials}, content=body)
                assert r.status_code == 401, (method, path, credentials, r.status_code, r.text)
                if method != "HEAD":
                    assert "peer" in r.json()["message"]
                refused += 1
        # The check can pass: the configured tokens (both of a rotation) are accepted.
        for token in (TOKEN, f"next-{TOKEN}"):
            assert c.get("/_internal/status", headers=bearer(token)).status_code == 200
    assert snapshot(node) == before
    assert_keys_served(node)
    failures = node.metrics()
    missing = failures['kura_internal_auth_failures_total{reason="missing"}']
    invalid = failures['kura_internal_auth_failures_total{reason="invalid"}']
    assert (missing + invalid, missing) == (refused, 3 * len(internal_requests(0)))
    log = node.log()
    assert "refused peer request from 127.0.0.1 (missing credentials)" in log
    assert "refused peer request from 127.0.0.1 (invalid credentials)" in log
    assert log.count("refused peer request") <= 2  # one line per cause, not per request
    assert "Traceback" not in log


def test_a_refused_replicate_is_answered_before_its_body_is_sent(
    start_node: Callable[..., NodeProcess],
) -> None:
    node = start_node(internal_tokens=TOKEN)
    manifest = turbo_manifest(KEYS[0], b"x" * (16 << 20), now_ms(), "forged")
    sock = connect(node.internal_url)
    try:
        # 16 MiB declared, not one byte sent: the answer cannot have waited for the body.
        send_head(
            sock,
            "PUT",
            "/_internal/replicate/artifact",
            {"Kura-Manifest": encode_manifest(manifest), "Content-Length": str(16 << 20)},
        )
        status, _headers, body = read_response(sock)
    finally:
        sock.close()
    assert status == 401, body
    assert node.staging_files() == []
    assert node.metric("kura_tmp_reserved_bytes") == 0
    assert node.index_rows() == 0


def test_a_mesh_with_the_peer_token_replicates_and_rotates(tmp_path: Path) -> None:
    # Mid-rotation: n0 still sends the old token, n1 already sends the new one; both accept both.
    mesh = Mesh(
        tmp_path,
        2,
        in_process=True,
        node_settings={
            0: {"internal_tokens": f"old-{TOKEN},new-{TOKEN}"},
            1: {"internal_tokens": f"new-{TOKEN},old-{TOKEN}"},
        },
    )
    try:
        mesh.wait_ready()
        write_keys(mesh.nodes[0])
        with mesh.nodes[1].client() as c:
            r = c.put("/cache/from-n1", content=b"n1 bytes")
            assert r.status_code == 201
        mesh.wait_drained()
        assert_keys_served(mesh.nodes[1])
        with mesh.nodes[0].client() as c:
            assert c.get("/cache/from-n1").content == b"n1 bytes"
        for node in mesh.nodes:
            assert node.metric('kura_internal_auth_failures_total{reason="invalid"}') == 0
            assert node.metric('kura_internal_auth_failures_total{reason="missing"}') == 0
        held = [manifests(n, f"new-{TOKEN}") for n in mesh.nodes]
        assert len(held[0]) == len(held[1]) == len(KEYS) + 1
    finally:
        mesh.stop_all()


def test_a_peer_that_refuses_this_nodes_token_is_named_in_ready_warnings(tmp_path: Path) -> None:
    """A wrong KURA_INTERNAL_TOKENS on one node: its copies wait in the outbox, and /ready's
    warnings say why (its reasons said only "initial discovery incomplete"). Fixing the token
    drains the outbox and clears the warning."""
    mesh = Mesh(
        tmp_path,
        2,
        in_process=True,
        discovery_settle_ms=0,
        replication_backoff_max_ms=300,
        node_settings={0: {"internal_tokens": f"wrong-{TOKEN}"}, 1: {"internal_tokens": TOKEN}},
    )
    try:
        writer, peer = mesh.nodes
        with writer.client() as c:
            assert c.put("/cache/waits", content=b"queued bytes").status_code == 201

        def warning() -> list[str]:
            ready = oneshot.get(writer.url + "/ready", timeout=10)
            return [w for w in ready.json()["warnings"] if peer.internal_url in w]

        assert wait_for(lambda: bool(warning()), 60), oneshot.get(writer.url + "/ready").text
        text = warning()[0]
        assert "replication to" in text, text
        assert "KURA_INTERNAL_TOKENS" in text, text
        assert "401" in text, text
        assert peer.metric('kura_internal_auth_failures_total{reason="invalid"}') >= 3
        writer.stop()
        mesh.node_settings[0] = {"internal_tokens": TOKEN}
        writer = mesh.restart(0)
        mesh.wait_drained()
        assert wait_for(lambda: not warning(), 30)
        with peer.client() as c:
            assert c.get("/cache/waits").content == b"queued bytes"
    finally:
        mesh.stop_all()


def test_a_far_future_tombstone_or_replica_with_credentials_is_refused_and_nothing_changes(
    start_node: Callable[..., NodeProcess],
) -> None:
    node = start_node(internal_tokens=TOKEN)
    write_keys(node)
    before = snapshot(node)
    future = now_ms() + DAY_MS
    with httpx.Client(base_url=node.internal_url, timeout=10, headers=bearer(TOKEN)) as c:
        r = c.delete(
            "/_internal/replicate/namespace",
            params={"namespace_id": NAMESPACE, "version_ms": future},
        )
        assert r.status_code == 400, r.text
        assert "KURA_MAX_CLOCK_SKEW_MS" in r.json()["message"]
        for key in (KEYS[0], "ee" * 8):  # an overwrite, and a new key
            evil = b"from the future"
            r = c.put(
                "/_internal/replicate/artifact",
                headers={"Kura-Manifest": encode_manifest(turbo_manifest(key, evil, future, "x"))},
                content=evil,
            )
            assert r.status_code == 400, r.text
            assert "ahead of this node's clock" in r.json()["message"]
    assert snapshot(node) == before
    assert_keys_served(node)
    metrics = node.metrics()
    assert (
        metrics['kura_replication_rejected_total{reason="future_version",source="replication"}']
        == 3
    )
    assert node.log().count("ms ahead of this node's clock") == 3
    # The refused versions did not pull the node's clock: its next write is stamped about now.
    with node.client() as c:
        assert c.put("/cache/after", content=b"after").status_code == 201
    stamped = [m["version_ms"] for m in manifests(node, TOKEN).values() if m["key"] == "after"]
    assert len(stamped) == 1
    assert abs(int(str(stamped[0])) - now_ms()) < 60_000


def test_bootstrap_from_a_peer_holding_far_future_versions_skips_them_and_completes(
    start_node: Callable[..., NodeProcess],
) -> None:
    source = start_node("source", internal_tokens=TOKEN)
    write_keys(source)
    with source.client() as c:
        assert c.put("/cache/far-future", content=b"stamped a day ahead").status_code == 201
    source.stop()
    # The peer "somehow" holds them (a broken clock, a forged copy from before this check):
    # put them straight into its index while it is stopped.
    future = now_ms() + DAY_MS
    conn = sqlite3.connect(source.data_dir / "index.sqlite3")
    with conn:
        conn.execute(
            "INSERT OR REPLACE INTO tombstones(namespace_id, version_ms) VALUES (?, ?)",
            (NAMESPACE, future),
        )
        (aid, version, sha256), *more = conn.execute(
            "SELECT artifact_id, version_ms, sha256 FROM artifacts WHERE key = 'far-future'"
        ).fetchall()
        conn.execute("UPDATE artifacts SET version_ms = ? WHERE artifact_id = ?", (future, aid))
    conn.close()
    assert more == []
    # A file-backed version would have its own blob file (layout 2) to move with the row; this
    # 19-byte body is inline in its row (KURA_INLINE_MAX_BYTES), so there is none.
    assert list(source.data_dir.glob(f"blobs/*/*/{aid}.{version}-{sha256[:16]}")) == []
    source = start_node("source", internal_tokens=TOKEN)
    assert "ahead of this node's clock: local writes" in source.log()  # told at start-up
    fresh = start_node("fresh", internal_tokens=TOKEN, peers=source.internal_url)
    assert wait_for(lambda: oneshot.get(fresh.url + "/ready").status_code == 200, 60), oneshot.get(
        fresh.url + "/ready"
    ).text
    assert_keys_served(fresh)  # the far-future tombstone was not applied
    assert oneshot.get(fresh.url + "/cache/far-future").status_code == 404
    metrics = fresh.metrics()
    assert (
        metrics['kura_replication_rejected_total{reason="future_version",source="bootstrap"}'] == 2
    )
    results = {k: v for k, v in metrics.items() if k.startswith("kura_bootstrap_artifact_results")}
    assert sum(v for k, v in results.items() if 'result="rejected_future"' in k) == 1
    assert sum(v for k, v in results.items() if 'result="applied"' in k) == len(KEYS)
    conn = sqlite3.connect(f"file:{fresh.data_dir / 'index.sqlite3'}?mode=ro", uri=True)
    try:
        assert conn.execute("SELECT COUNT(*) FROM tombstones").fetchone()[0] == 0
    finally:
        conn.close()


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
def test_a_node_on_a_non_loopback_host_without_peer_credentials_refuses_to_start(
    tmp_path: Path, host: str
) -> None:
    env = node_env(tmp_path, host=host)
    stderr = serve_refused(env, cwd=tmp_path)
    assert "KURA_INTERNAL_TOKENS" in stderr
    assert "openssl rand -hex 32" in stderr
    assert not (tmp_path / "data" / "index.sqlite3").exists()


def test_a_node_on_a_non_loopback_host_with_a_peer_token_starts_and_requires_it(
    start_node: Callable[..., NodeProcess],
) -> None:
    node = start_node(host="0.0.0.0", internal_tokens=TOKEN)
    internal = node.internal_url.replace("0.0.0.0", "127.0.0.1")
    assert oneshot.get(node.url.replace("0.0.0.0", "127.0.0.1") + "/up").status_code == 200
    assert oneshot.get(internal + "/_internal/status").status_code == 401
    assert oneshot.get(internal + "/_internal/status", headers=bearer(TOKEN)).status_code == 200
    # No public token on a non-loopback host: an open cache on the network, said loudly.
    assert "has no tokens" in node.log()
    assert "anyone who can reach" in node.log()
    guarded = start_node("guarded", host="0.0.0.0", internal_tokens=TOKEN, read_write_tokens="rw")
    assert oneshot.get(guarded.url.replace("0.0.0.0", "127.0.0.1") + "/up").status_code == 200
    assert "has no tokens" not in guarded.log()


def test_with_mutual_tls_and_a_peer_token_both_are_required(
    tmp_path: Path, start_node: Callable[..., NodeProcess]
) -> None:
    pki = tmp_path / "pki"
    pki.mkdir()
    make_ca(pki, "ca")
    make_leaf(pki, "ca", "node")
    tls = {
        "internal_tls_ca_cert_path": pki / "ca.pem",
        "internal_tls_cert_path": pki / "node.pem",
        "internal_tls_key_path": pki / "node.key",
    }
    # mTLS alone is a credential: a non-loopback host may use it without a token.
    alone = start_node("alone", host="0.0.0.0", **tls)
    url = alone.internal_url.replace("0.0.0.0", "127.0.0.1") + "/_internal/status"
    assert oneshot.get(url, verify=tls_client(pki, "node")).status_code == 200
    with pytest.raises((httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError)):
        oneshot.get(url, verify=tls_client(pki, None), headers=bearer(TOKEN))
    # Both configured: a mesh replicates with both, and a certificate without the token is 401.
    mesh = Mesh(tmp_path / "mesh", 2, in_process=True, scheme="https", internal_tokens=TOKEN, **tls)
    try:
        mesh.wait_ready()
        write_keys(mesh.nodes[0])
        mesh.wait_drained()
        assert_keys_served(mesh.nodes[1])
        url = mesh.nodes[0].internal_url + "/_internal/status"
        assert oneshot.get(url, verify=tls_client(pki, "node")).status_code == 401
        ok = oneshot.get(url, verify=tls_client(pki, "node"), headers=bearer(TOKEN))
        assert ok.status_code == 200
        with pytest.raises((httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError)):
            oneshot.get(url, verify=tls_client(pki, None), headers=bearer(TOKEN))
    finally:
        mesh.stop_all()


def test_read_through_refuses_a_far_future_copy_and_answers_a_miss(
    start_node: Callable[..., NodeProcess],
) -> None:
    future = honest("rt-future", b"from a peer a day ahead", now_ms() + DAY_MS)
    present = honest("rt-present", b"from a peer on time")
    # TEST DOUBLE (see fakepeer.py): no real node can be made to hold a far-future version
    # now that every node refuses them.
    with FakePeer([future, present]) as peer:
        node = start_node(peers=peer.url, read_through="always")
        with node.client() as c:
            assert c.get("/cache/rt-future").status_code == 404
            assert c.get("/cache/rt-present").content == b"from a peer on time"
        metrics = node.metrics()
        key = 'kura_replication_rejected_total{reason="future_version",source="read_through"}'
        assert metrics[key] == 1
        # A read-through is answered before its copy is stored (test_read_through_default):
        # the copy lands.
        assert wait_for(lambda: node.index_rows() == 1 and node.staging_files() == [], 10)
        with node.client() as c:  # the one row is the on-time copy: the refused one never lands
            assert c.get("/cache/rt-future").status_code == 404
            assert c.get("/cache/rt-present").content == b"from a peer on time"
        assert node.index_rows() == 1
