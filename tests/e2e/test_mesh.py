"""Replication between real node processes on loopback (the peer-mesh issue's must-shows)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests import oneshot
from tests.conftest import NodeProcess, spawn_node, wants_in_process
from tests.e2e.mesh import Mesh, manifests, status, wait_for
from tests.reapi import action_result

pytestmark = pytest.mark.in_process


@pytest.fixture
def mesh3(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Mesh]:
    mesh = Mesh(tmp_path, 3, in_process=wants_in_process(request), discovery_settle_ms=200)
    try:
        mesh.wait_ready()
        yield mesh
    finally:
        rcs = mesh.stop_all()
        assert all(rc in (0, -signal.SIGKILL) for rc in rcs), rcs


def fetch(node: NodeProcess, path: str) -> httpx.Response:
    return oneshot.get(node.url + path, timeout=30)


def test_a_write_through_each_protocol_family_is_readable_byte_identical_on_every_node(
    mesh3: Mesh,
) -> None:
    a, b, c = mesh3.nodes
    big = os.urandom(3 * 1024 * 1024)  # past the in-memory path: the file/sendfile path
    digest = hashlib.sha256(big).hexdigest()
    ac_body = action_result({"out": big})  # the ActionResult's output is the CAS blob
    kv = {"cas_id": "c1", "entries": [{"value": "v1"}, {"value": "v2"}]}
    with a.client() as w:
        assert (
            w.post("/api/cache/cas/x1?tenant_id=t&namespace_id=p", content=b"xcode").status_code
            == 204
        )
        assert w.put("/api/cache/keyvalue?tenant_id=t&namespace_id=p", json=kv).status_code == 204
        assert w.put("/api/cache/gradle/g1?tenant_id=t", content=b"gradle").status_code == 201
        assert w.put("/v1/cache/1234", content=b"nx-bytes").status_code == 200
        assert (
            w.put(
                "/v8/artifacts/abc?slug=team", content=b"turbo", headers={"x-artifact-tag": "TAG1"}
            ).status_code
            == 202
        )
        assert w.put(f"/cache/cas/{digest}", content=big).status_code == 200
        assert w.put(f"/cache/ac/{digest}", content=ac_body).status_code == 200
    expected = {
        "/api/cache/cas/x1?tenant_id=t&namespace_id=p": b"xcode",
        "/api/cache/gradle/g1?tenant_id=t": b"gradle",
        "/v1/cache/1234": b"nx-bytes",
        "/v8/artifacts/abc?slug=team": b"turbo",
        f"/cache/cas/{digest}": big,
        f"/cache/ac/{digest}": ac_body,
    }
    for node in (b, c):
        for path, body in expected.items():
            assert wait_for(lambda n=node, p=path: fetch(n, p).status_code == 200, 15), path
            assert fetch(node, path).content == body, path
        assert fetch(node, "/v8/artifacts/abc?slug=team").headers["x-artifact-tag"] == "TAG1"
        r = fetch(node, "/api/cache/keyvalue/c1?tenant_id=t&namespace_id=p")
        assert r.json() == {"entries": kv["entries"]}
    mesh3.wait_drained()
    # Every node holds the same artifacts at the same versions.
    views = [manifests(n) for n in mesh3.nodes]
    assert views[0] == views[1] == views[2]


@pytest.mark.process  # node b is killed
def test_a_node_killed_during_500_writes_has_all_of_them_after_restart(mesh3: Mesh) -> None:
    a, b, _c = mesh3.nodes
    b.stop(signal.SIGKILL)
    bodies = {f"/cache/outage/{i:04d}": f"artifact {i}".encode() * 10 for i in range(500)}
    with a.client() as w:
        for path, body in bodies.items():
            assert w.put(path, content=body).status_code == 201
    assert status(a)["outbox_messages"] >= 500  # B's share waits in A's outbox
    b = mesh3.restart(1)
    assert wait_for(lambda: status(a)["outbox_messages"] == 0, 90), status(a)
    with b.client() as r:
        for path, body in bodies.items():
            got = r.get(path)
            assert got.status_code == 200, path
            assert got.content == body, path
    # Nothing duplicated: one row per key on B, and the same set as A.
    assert b.index_rows() == a.index_rows() == len(bodies)
    # Equal but for ``inline``, which says how each node stores a copy: a restarted node's
    # bootstrap stores small artifacts inline, in batches (kura.mesh.bootstrap_batch).
    assert without_inline(manifests(a)) == without_inline(manifests(b))


def test_a_clean_beats_a_delayed_replica_of_an_older_write(mesh3: Mesh) -> None:
    a, b, c = mesh3.nodes
    q = "tenant_id=t&namespace_id=proj"
    with a.client() as w:
        assert w.post(f"/api/cache/cas/old?{q}", content=b"old bytes").status_code == 204
    mesh3.wait_drained()
    # Capture the write as a peer would ship it (manifest + body): the "delayed replica".
    aid = next(iter(manifests(a)))
    stale = oneshot.get(f"{a.internal_url}/_internal/bootstrap/artifacts/{aid}")
    assert stale.status_code == 200
    with a.client() as w:
        assert w.delete(f"/api/cache/clean?{q}").status_code == 204
    mesh3.wait_drained()
    for node in (b, c):
        r = oneshot.put(
            f"{node.internal_url}/_internal/replicate/artifact",
            content=stale.content,
            headers={"Kura-Manifest": stale.headers["Kura-Manifest"]},
        )
        assert r.status_code == 204
        assert r.headers["Kura-Outcome"] == "ignored_tombstone"
    for node in mesh3.nodes:
        assert fetch(node, f"/api/cache/cas/old?{q}").status_code == 404
        assert node.index_rows() == 0
        assert node.metric(
            'kura_replication_apply_results_total{outcome="ignored_tombstone",source="replication"}'
        ) == (0 if node is a else 1)
    # A newer write to the same namespace after the clean is accepted everywhere.
    with b.client() as w:
        assert w.post(f"/api/cache/cas/new?{q}", content=b"new").status_code == 204
    for node in mesh3.nodes:
        assert wait_for(lambda n=node: fetch(n, f"/api/cache/cas/new?{q}").status_code == 200, 15)


def test_public_port_never_serves_internal_routes(mesh3: Mesh) -> None:
    a = mesh3.nodes[0]
    for path in (
        "/_internal/status",
        "/_internal/bootstrap/manifests",
        "/_internal/bootstrap/artifacts/" + "0" * 64,
    ):
        assert fetch(a, path).status_code == 404
    assert oneshot.get(a.internal_url + "/_internal/status").json()["node_url"] == a.internal_url


def test_up_lists_the_members_and_metrics_count_replication(mesh3: Mesh) -> None:
    a = mesh3.nodes[0]
    up = fetch(a, "/up").json()
    assert up["members"] == sorted(mesh3.internal_urls)
    assert up["ring_members"] == 3
    with a.client() as w:
        assert w.put("/v1/cache/77", content=b"x").status_code == 200
    mesh3.wait_drained()
    m = a.metrics()
    assert m['kura_mesh_peers{state="healthy"}'] == 2
    applied = [k for k in m if k.startswith("kura_replication_requests_total") and "applied" in k]
    assert len(applied) == 2
    assert all(m[k] >= 1 for k in applied)
    assert m['kura_mesh_membership_changes_total{change="joined"}'] == 2
    out = subprocess.run(
        [sys.executable, "-m", "kura.cli", "status", "--url", a.url],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    for url in mesh3.internal_urls[1:]:
        assert url in out.stdout
    assert "healthy" in out.stdout


def test_a_joining_node_reads_through_to_its_peers(tmp_path: Path) -> None:
    mesh = Mesh(
        tmp_path, 2, in_process=True, discovery_settle_ms=60000
    )  # stays "settling", i.e. not ready
    try:
        a, b = mesh.nodes
        with a.client() as w:
            assert w.put("/v1/cache/555", content=b"from a").status_code == 200
        # Stop replication to B from being the reason B has it: read on B right away, and
        # check the read-through counter moved.
        assert oneshot.get(b.url + "/ready").status_code == 503
        assert wait_for(lambda: fetch(b, "/v1/cache/555").status_code == 200, 15)
        assert fetch(b, "/v1/cache/555").content == b"from a"
    finally:
        mesh.stop_all()


def test_read_through_serves_a_miss_from_a_peer_when_replication_has_not_delivered(
    tmp_path: Path,
) -> None:
    mesh = Mesh(tmp_path, 2, discovery_settle_ms=60000)
    try:
        a, b = mesh.nodes
        # Write on A while B is paused, so A's replication to B cannot have happened yet.
        b.proc.send_signal(signal.SIGSTOP)
        with a.client() as w:
            assert w.put("/cache/rt/key", content=b"only on a").status_code == 201
        a_ship = status(a)
        b.proc.send_signal(signal.SIGCONT)
        assert a_ship["outbox_messages"] >= 1
        r = fetch(b, "/cache/rt/key")
        assert r.status_code == 200
        assert r.content == b"only on a"
        assert (
            b.metric('kura_read_through_total{result="hit"}')
            + b.metric(
                'kura_replication_apply_results_total{outcome="applied",source="replication"}'
            )
            >= 1
        )
    finally:
        mesh.stop_all()


def test_a_peer_at_its_outbox_cap_is_marked_for_catch_up_and_writes_go_on(
    tmp_path: Path,
) -> None:
    """Issue 11 replaced "503 at the cap": the cap is per peer and never refuses a write. Issue
    27: the queue that reached the cap is dropped, and the peer pulls what it missed."""
    mesh = Mesh(tmp_path, 2, outbox_max_depth=5, discovery_settle_ms=0)
    try:
        a, b = mesh.nodes
        b.stop(signal.SIGKILL)
        with a.client() as w:
            for i in range(8):
                assert w.put(f"/cache/cap/{i}", content=b"x").status_code == 201
        assert wait_for(lambda: status(a)["peers"][0]["forgotten_at"] is not None, 30)
        peer = status(a)["peers"][0]
        assert peer["outbox_dropped_messages"] == 5  # the queue it held at its cap, in one go
        assert peer["needs_catch_up"] is True
        assert peer["catch_up_reason"] == "overflow"
        # Writes past the cap were skipped until the queue was dropped; after it, left out
        # while B is down (the mark covers them).
        assert a.metric_sum("kura_outbox_skipped_messages_total") <= 3
        b = mesh.restart(1)
        assert wait_for(lambda: len(manifests(b)) == 8, 60), manifests(b)
        assert wait_for(lambda: status(a)["peers"][0]["needs_catch_up"] is False, 30)
        assert wait_for(lambda: status(a)["outbox_messages"] == 0, 60)
    finally:
        mesh.stop_all()


def test_peers_of_another_tenant_are_not_admitted(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path, 2, in_process=True, discovery_settle_ms=0)
    try:
        mesh.wait_ready()
        a, b = mesh.nodes
        assert [p["known"] for p in status(a)["peers"]] == [True]
        # B's address now answers as another tenant: A must drop it and stop queueing for it.
        b.stop()
        other = spawn_node(
            tmp_path / "other",
            dict(
                b.env,
                KURA_TENANT_ID="other",
                KURA_DATA_DIR=str(tmp_path / "o/data"),
                KURA_TMP_DIR=str(tmp_path / "o/tmp"),
            ),
        )
        try:
            assert wait_for(lambda: status(a)["peers"] == [], 15), status(a)
            assert a.metric('kura_mesh_membership_changes_total{change="left"}') == 1
            with a.client() as w:
                assert w.put("/v1/cache/31", content=b"mine").status_code == 200
            assert status(a)["outbox_messages"] == 0
            assert status(other)["peers"] == []
            assert "not a peer" in other.log()
        finally:
            other.stop()
    finally:
        mesh.stop_all()


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_ca(directory: Path, name: str) -> None:
    openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        f"/CN={name}",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.pem",
        cwd=directory,
    )


def make_leaf(directory: Path, ca: str, name: str) -> None:
    openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        f"/CN={name}",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.csr",
        cwd=directory,
    )
    (directory / f"{name}.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n"
    )
    openssl(
        "x509",
        "-req",
        "-in",
        f"{name}.csr",
        "-CA",
        f"{ca}.pem",
        "-CAkey",
        f"{ca}.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        f"{name}.ext",
        "-out",
        f"{name}.pem",
        cwd=directory,
    )


def tls_client(pki: Path, leaf: str | None) -> ssl.SSLContext:
    """A client context trusting the mesh CA, presenting ``leaf``'s certificate if given."""
    ctx = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    if leaf is not None:
        ctx.load_cert_chain(str(pki / f"{leaf}.pem"), str(pki / f"{leaf}.key"))
    return ctx


def test_mutual_tls_refuses_peers_without_a_ca_signed_certificate(tmp_path: Path) -> None:
    pki = tmp_path / "pki"
    pki.mkdir()
    make_ca(pki, "ca")
    make_leaf(pki, "ca", "node")
    make_ca(pki, "rogue-ca")
    make_leaf(pki, "rogue-ca", "rogue")
    tls = {
        "internal_tls_ca_cert_path": pki / "ca.pem",
        "internal_tls_cert_path": pki / "node.pem",
        "internal_tls_key_path": pki / "node.key",
    }
    mesh = Mesh(tmp_path / "mesh", 2, in_process=True, scheme="https", discovery_settle_ms=0, **tls)
    try:
        mesh.wait_ready()
        a, b = mesh.nodes
        # The mesh itself works over mTLS: a write on A reaches B.
        with a.client() as w:
            assert w.put("/v1/cache/9", content=b"over tls").status_code == 200
        assert wait_for(lambda: fetch(b, "/v1/cache/9").status_code == 200, 15)
        url = a.internal_url + "/_internal/status"
        # With the right certificate a peer is served...
        ok = oneshot.get(url, verify=tls_client(pki, "node"))
        assert ok.status_code == 200
        # ...without one, or with one from another CA, the handshake is refused.
        for ctx in (tls_client(pki, None), tls_client(pki, "rogue")):
            with pytest.raises((httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError)):
                oneshot.get(url, verify=ctx)
        # And the public port never serves /_internal/.
        assert fetch(a, "/_internal/status").status_code == 404
        assert json.loads(oneshot.get(a.url + "/up").text)["ring_members"] == 2
    finally:
        mesh.stop_all()


def without_inline(view: dict[str, dict[str, object]]) -> dict[str, dict[str, object]]:
    return {aid: {k: v for k, v in m.items() if k != "inline"} for aid, m in view.items()}
