"""A header value stored with an artifact is later sent as a response header, so CR, LF and other
control characters are refused at every entry point and never emitted (issue 10 §7: a
replicated ``x-artifact-tag`` with CR/LF made every GET of its key close without an answer)."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from kura.core.keys import artifact_id
from tests import oneshot
from tests.conftest import NodeProcess, node_env, spawn_node
from tests.e2e.mesh import wait_for
from tests.integration import rawhttp

pytestmark = pytest.mark.in_process

BAD_VALUES = [b"a\x01b", b"a\rb", b"a\x00b", b"a\x7fb", b"caf\xc3\xa9"]


def test_a_replica_whose_stored_header_has_cr_lf_is_refused_and_nothing_stored(
    node: NodeProcess,
) -> None:
    body = b"replica body"
    now = int(time.time() * 1000)
    for value in ("tag\r\nInjected: 1", "tag\nx", "tag\x00", "t" * 1025):
        manifest = {
            "artifact_id": artifact_id("turbo", "default", "t", "h1"),
            "producer": "turbo",
            "namespace_id": "t",
            "key": "h1",
            "content_type": "application/octet-stream",
            "size": len(body),
            "sha256": hashlib.sha256(body).hexdigest(),
            "version_ms": now,
            "created_at_ms": now,
            "headers": {"x-artifact-tag": value},
        }
        r = oneshot.put(
            node.internal_url + "/_internal/replicate/artifact",
            content=body,
            headers={"Kura-Manifest": json.dumps(manifest, separators=(",", ":"))},
        )
        assert r.status_code == 400, (value, r.text)
        assert "x-artifact-tag header" in r.json()["message"]
    assert node.index_rows() == 0
    assert node.staging_files() == []
    with node.client() as c:
        assert c.get("/v8/artifacts/h1?teamId=t").status_code == 404


def test_a_turbo_tag_with_a_control_character_is_refused(node: NodeProcess) -> None:
    for value in BAD_VALUES:
        with rawhttp.connect(node.url) as s:
            s.sendall(
                b"PUT /v8/artifacts/h2?teamId=t HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n"
                b"x-artifact-tag: " + value + b"\r\n\r\nabc"
            )
            status, _h, body = rawhttp.read_response(s)
        assert status == 400, (value, body)
    assert node.index_rows() == 0
    with node.client() as c:
        r = c.put("/v8/artifacts/h2?teamId=t", content=b"abc", headers={"x-artifact-tag": "ok="})
        assert r.status_code == 202
        r = c.get("/v8/artifacts/h2?teamId=t")
        assert (r.status_code, r.headers["x-artifact-tag"]) == (200, "ok=")


def _poison_tag(data_dir: Path, key: str) -> None:
    """Rewrite a stored row's headers behind the node's back (it is stopped): what an old
    version, or a peer before this rule, could have stored."""
    conn = sqlite3.connect(data_dir / "index.sqlite3")
    with conn:
        n = conn.execute(
            "UPDATE artifacts SET headers = ? WHERE key = ?",
            (json.dumps({"x-artifact-tag": "evil\r\nSet-Cookie: x=1"}), key),
        ).rowcount
    conn.close()
    assert n == 1


def test_a_stored_bad_header_is_never_sent_or_spread_to_peers(
    start_node: Callable[..., NodeProcess], tmp_path: Path
) -> None:
    a = start_node("a")
    with a.client() as c:
        for key in ("good", "poisoned"):
            r = c.put(
                f"/v8/artifacts/{key}?teamId=t",
                content=key.encode(),
                headers={"x-artifact-tag": "sig="},
            )
            assert r.status_code == 202
    a.stop()
    _poison_tag(a.data_dir, "poisoned")
    a = spawn_node(tmp_path / "a", a.env)
    try:
        # Defence in depth: every key still answers, the bad value is left out.
        with a.client() as c:
            good = c.get("/v8/artifacts/good?teamId=t")
            assert (good.status_code, good.headers.get("x-artifact-tag")) == (200, "sig=")
            bad = c.get("/v8/artifacts/poisoned?teamId=t")
            assert (bad.status_code, bad.content) == (200, b"poisoned")
            assert "x-artifact-tag" not in bad.headers
            assert "set-cookie" not in bad.headers

        # A fresh peer bootstraps from it: the good copy arrives, the poisoned one is refused.
        b_dir = tmp_path / "b"
        env = node_env(b_dir, peers=a.internal_url, read_through="always")
        b = spawn_node(b_dir, env)
        try:
            assert wait_for(lambda: oneshot.get(b.url + "/ready").status_code == 200, 60)
            assert b.index_rows() == 1
            with b.client() as c:
                assert c.get("/v8/artifacts/good?teamId=t").status_code == 200
                # Read-through from the peer refuses the manifest too: an answer, a miss.
                assert c.get("/v8/artifacts/poisoned?teamId=t").status_code == 404
            assert b.index_rows() == 1
            assert "refused a manifest" in b.log()
            assert "Traceback" not in b.log()
        finally:
            b.stop()
    finally:
        a.stop()
