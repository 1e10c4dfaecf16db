"""Incremental catch-up (issue 11, deliverable 2) on real node processes over real HTTP.

A restarted node pulls only what changed since its durable cursor with each peer, and the cost
(``kura_peer_metadata_requests_total``/``kura_peer_metadata_bytes_total``, kind ``changes``)
grows with the changes, not with the dataset; a kill -9 mid catch-up resumes from the durable
cursor; a peer whose index was rebuilt (a new epoch) is bootstrapped fully again; a page's
tombstones are applied before its manifests; the route refuses bad input and unauthenticated
peers.

The peer that holds the data forgets the stopped node (``KURA_PEER_FORGET_AFTER=2s``) before
the writes it misses, so nothing is queued for it: only its pull can bring them.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import signal
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from tests import oneshot
from tests.conftest import NodeProcess, node_env, spawn_node
from tests.e2e.mesh import Mesh, manifests, peer_row, status, wait_for

pytestmark = pytest.mark.in_process

COMMON: dict[str, object] = {
    "discovery_settle_ms": 200,
    "discovery_interval_ms": 500,
    "changes_poll_interval": "1s",
    "peer_forget_after": "2s",
    "read_through": "never",  # a GET answers from the node's own store only
}
NAMESPACE = "team"


def body_of(key: str) -> bytes:
    return f"bytes of {key} ".encode() * 4


def write(node: NodeProcess, prefix: str, count: int) -> dict[str, bytes]:
    bodies = {f"{prefix}/{i:05d}": body_of(f"{prefix}/{i}") for i in range(count)}
    with node.client() as c:
        for key, body in bodies.items():
            assert c.put(f"/cache/{key}", content=body).status_code == 201, key
    return bodies


def feed_head(node: NodeProcess) -> tuple[str, int]:
    page = oneshot.get(
        node.internal_url + "/_internal/changes", params={"since": 0, "limit": 1}, timeout=10
    ).json()
    return str(page["epoch"]), int(page["head_seq"])


def bootstrap_peer(node: NodeProcess, peer_url: str) -> dict[str, object]:
    """``node``'s ``/status`` bootstrap row for ``peer_url``; ``{}`` until it lists the peer (a
    node learns its peers just after it starts)."""
    peers = status(node)["bootstrap"]["peers"]  # type: ignore[index]
    return next((p for p in peers if p["peer"] == peer_url), {})


def cursor_at_head(node: NodeProcess, peer: NodeProcess) -> bool:
    return bootstrap_peer(node, peer.internal_url).get("cursor") == feed_head(peer)[1]


def metadata(node: NodeProcess, what: str, kind: str) -> float:
    return node.metric(f'kura_peer_metadata_{what}_total{{kind="{kind}"}}')


def assert_serves(node: NodeProcess, bodies: dict[str, bytes]) -> None:
    with node.client() as c:
        for key, body in bodies.items():
            got = c.get(f"/cache/{key}")
            assert (got.status_code, got.content) == (200, body), key


def stop_and_get_forgotten(a: NodeProcess, b: NodeProcess) -> None:
    """Stop ``b`` once its cursor with ``a`` is at ``a``'s head; wait until ``a`` forgot it."""
    assert wait_for(lambda: cursor_at_head(b, a), 30), bootstrap_peer(b, a.internal_url)
    assert b.stop() == 0
    assert wait_for(lambda: peer_row(a, b.internal_url)["forgotten_at"] is not None, 30)


@pytest.mark.slow
def test_a_restarted_node_pulls_only_what_changed_at_a_cost_proportional_to_the_changes(
    tmp_path: Path,
) -> None:
    n, changes = 2000, 100
    mesh = Mesh(tmp_path, 2, in_process=True, **COMMON)
    c: NodeProcess | None = None
    try:
        mesh.wait_ready()
        a, b = mesh.nodes
        old = write(a, "old", n)
        assert wait_for(lambda: len(manifests(b)) == n, 120), len(manifests(b))
        stop_and_get_forgotten(a, b)
        new = write(a, "new", changes)
        b = mesh.restart(1)
        assert wait_for(lambda: len(manifests(b)) == n + changes, 60), len(manifests(b))
        mesh.wait_ready()
        assert_serves(b, new)
        assert {m["key"] for m in manifests(b).values()} == set(old) | set(new)
        change_requests = metadata(b, "requests", "changes")
        change_bytes = metadata(b, "bytes", "changes")
        peer = bootstrap_peer(b, a.internal_url)
        assert peer["mode"] == "incremental", peer
        assert metadata(b, "requests", "bootstrap") == 0  # no full walk on restart
        assert metadata(b, "bytes", "bootstrap") == 0
        # The pull cleared A's mark for B.
        assert wait_for(lambda: peer_row(a, b.internal_url)["needs_catch_up"] is False, 30)
        assert "caught up by pulling our change feed" in a.log()
        # The full walk of the same data, measured: a fresh node bootstraps from A.
        env = node_env(tmp_path / "fresh", **COMMON)
        env["KURA_PEERS"] = a.internal_url
        c = spawn_node(tmp_path / "fresh", env)
        assert wait_for(lambda: oneshot.get(c.url + "/ready").status_code == 200, 120), status(c)
        assert len(manifests(c)) == n + changes
        full_requests = metadata(c, "requests", "bootstrap")
        full_bytes = metadata(c, "bytes", "bootstrap")
        one_walk_bytes = full_bytes / 2  # a full pass walks the manifests twice (count, fetch)
        print(
            f"\ncatch-up of {changes} changes over {n} artifacts: {change_requests:.0f} changes "
            f"requests, {change_bytes:.0f} bytes; full bootstrap of {n + changes}: "
            f"{full_requests:.0f} requests, {full_bytes:.0f} bytes "
            f"({one_walk_bytes:.0f} per walk); ratio {change_bytes / one_walk_bytes:.3f}"
        )
        assert change_bytes < 0.2 * one_walk_bytes
        assert change_requests < full_requests
    finally:
        rcs = mesh.stop_all() + ([c.stop()] if c else [])
        assert all(rc == 0 for rc in rcs), rcs


def test_a_node_killed_mid_catch_up_resumes_from_its_durable_cursor(tmp_path: Path) -> None:
    changes = 1000  # 4 pages of 256
    mesh = Mesh(tmp_path, 2, **COMMON)
    try:
        mesh.wait_ready()
        a, b = mesh.nodes
        stop_and_get_forgotten(a, b)
        cursor_before = feed_head(a)[1]
        bodies = write(a, "k", changes)
        head = feed_head(a)[1]
        # Restart B with every page held for 2 s after it is applied and before its cursor
        # moves, then SIGKILL it once its durable cursor has moved at least once.
        env = mesh._env(1)
        env["KURA_FAILPOINTS"] = "bootstrap.changes_page_applied=sleep(2000)"
        b = mesh.nodes[1] = spawn_node(tmp_path / "n1", env)

        def cursor() -> int:
            value = bootstrap_peer(b, a.internal_url).get("cursor")
            return int(value) if isinstance(value, int) else -1

        assert wait_for(lambda: cursor() > cursor_before, 60), bootstrap_peer(b, a.internal_url)
        at_kill = cursor()
        b.stop(signal.SIGKILL)
        assert cursor_before < at_kill < head
        # A pull that never reached A's head does not clear A's mark for B.
        assert peer_row(a, b.internal_url)["needs_catch_up"] is True
        b = mesh.restart(1)
        assert wait_for(lambda: len(manifests(b)) == changes, 60), len(manifests(b))
        assert_serves(b, bodies)
        resumed = [int(s) for s in re.findall(r"incremental from cursor (\d+)", b.log())]
        assert resumed, b.log()[-2000:]
        assert resumed[0] >= at_kill, resumed
        label = a.internal_url.split("://")[1]
        applied = b.metric(
            f'kura_bootstrap_artifact_results_total{{peer="{label}",result="applied"}}'
        )
        assert applied <= changes - 256, applied  # the first page was not fetched again
        assert metadata(b, "requests", "bootstrap") == 0
        assert wait_for(lambda: peer_row(a, b.internal_url)["needs_catch_up"] is False, 30)
        print(
            f"\nkilled at cursor {at_kill} of {head}; resumed from {resumed[0]}, "
            f"fetched {applied:.0f} of {changes} after the restart"
        )
    finally:
        rcs = mesh.stop_all()
        assert all(rc in (0, -signal.SIGKILL) for rc in rcs), rcs


def test_a_peer_with_a_rebuilt_index_is_bootstrapped_fully_again(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path, 2, in_process=True, **{**COMMON, "peer_forget_after": "6h"})
    try:
        mesh.wait_ready()
        a, b = mesh.nodes
        first = write(a, "before", 10)
        assert wait_for(lambda: len(manifests(b)) == 10, 60)
        assert wait_for(lambda: cursor_at_head(b, a), 30)
        old_epoch = feed_head(a)[0]
        assert b.stop() == 0
        assert a.stop() == 0
        shutil.rmtree(a.data_dir)  # A's index is gone: it starts a new epoch
        a = mesh.restart(0)
        assert feed_head(a)[0] != old_epoch
        later = write(a, "after", 5)
        b = mesh.restart(1)
        assert wait_for(lambda: {m["key"] for m in manifests(b).values()} >= set(later), 60)
        mesh.wait_ready()
        assert_serves(b, {**first, **later})
        assert "does not fit the peer's feed" in b.log()
        # Its first pass after the restart was the full walk (later polls are incremental).
        first_pass = re.search(r"incremental from cursor|running a full bootstrap", b.log())
        assert first_pass is not None
        assert first_pass.group(0) == "running a full bootstrap"
        assert metadata(b, "requests", "bootstrap") > 0
        assert wait_for(lambda: cursor_at_head(b, a), 30)  # its cursor is in the new epoch
    finally:
        rcs = mesh.stop_all()
        assert all(rc == 0 for rc in rcs), rcs


def turbo_put(node: NodeProcess, key: str, body: bytes) -> None:
    with node.client() as c:
        r = c.put(f"/v8/artifacts/{key}", params={"slug": NAMESPACE}, content=body)
        assert r.status_code == 202, r.text


def test_a_pages_tombstones_are_applied_before_its_manifests(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path, 2, in_process=True, **COMMON)
    try:
        mesh.wait_ready()
        a, b = mesh.nodes
        before = [f"{i:02x}" * 8 for i in range(4)]
        after = [f"{i:02x}" * 8 for i in range(10, 13)]
        for key in before:
            turbo_put(a, key, b"old " + key.encode())
        assert wait_for(lambda: len(manifests(b)) == len(before), 60)
        stop_and_get_forgotten(a, b)
        with a.client() as c:
            params = {"tenant_id": "default", "namespace_id": NAMESPACE}
            assert c.delete("/api/cache/clean", params=params).status_code == 204
        for key in after:
            turbo_put(a, key, b"new " + key.encode())
        page = oneshot.get(
            a.internal_url + "/_internal/changes", params={"since": feed_head(a)[1] - 4}
        ).json()
        assert [t["namespace_id"] for t in page["tombstones"]] == [NAMESPACE]
        assert len(page["manifests"]) == len(after)  # one page: the clean, then the writes
        b = mesh.restart(1)
        assert wait_for(lambda: {m["key"] for m in manifests(b).values()} == set(after), 60), {
            m["key"] for m in manifests(b).values()
        }
        # B numbers its own changes in the order it made them: the tombstone came first.
        conn = sqlite3.connect(f"file:{b.data_dir / 'index.sqlite3'}?mode=ro", uri=True)
        try:
            tomb = conn.execute(
                "SELECT seq FROM tombstones WHERE namespace_id = ?", (NAMESPACE,)
            ).fetchone()[0]
            firsts = conn.execute(
                "SELECT MIN(seq) FROM artifacts WHERE namespace_id = ?", (NAMESPACE,)
            ).fetchone()[0]
        finally:
            conn.close()
        assert tomb < firsts, (tomb, firsts)
        with b.client() as c:
            for key in before:
                assert c.get(f"/v8/artifacts/{key}", params={"slug": NAMESPACE}).status_code == 404
            for key in after:
                got = c.get(f"/v8/artifacts/{key}", params={"slug": NAMESPACE})
                assert got.content == b"new " + key.encode()
    finally:
        rcs = mesh.stop_all()
        assert all(rc == 0 for rc in rcs), rcs


TOKEN = "peer-" + hashlib.sha256(b"changes").hexdigest()[:32]


def test_the_change_feed_refuses_bad_input_and_unauthenticated_peers(
    start_node: Callable[..., NodeProcess],
) -> None:
    node = start_node("feed", internal_tokens=TOKEN)
    url = node.internal_url + "/_internal/changes"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert oneshot.get(url, params={"since": 0}).status_code == 401
    assert (
        oneshot.get(url, params={"since": 0}, headers={"Authorization": "Bearer x"}).status_code
        == 401
    )
    for params, message in (
        ({}, "since is required"),
        ({"since": "abc"}, "since must be a decimal integer"),
        ({"since": "-1"}, "since must be a decimal integer"),
        # int() would read these as 10, 10 and 1 (module docstring of kura.api.query).
        ({"since": "1_0"}, "since must be a decimal integer"),
        ({"since": "\u0661\u0660"}, "since must be a decimal integer"),
        ({"since": " 1"}, "since must be a decimal integer"),
        ({"since": "99999999999999999999"}, "since must be a decimal integer"),
        ({"since": "0", "limit": "0"}, "limit must be between 1 and 1000"),
        ({"since": "0", "limit": "1001"}, "limit must be between 1 and 1000"),
        ({"since": "0", "limit": "x"}, "limit must be a decimal integer"),
    ):
        r = oneshot.get(url, params=params, headers=auth)
        assert r.status_code == 400, (params, r.status_code)
        assert message in r.text, (params, r.text)
    write(node, "k", 3)
    page = oneshot.get(url, params={"since": 0, "limit": 2}, headers=auth).json()
    assert set(page) == {"epoch", "tombstones", "manifests", "next_since", "head_seq", "more"}
    assert (len(page["manifests"]), page["next_since"], page["head_seq"], page["more"]) == (
        2,
        2,
        3,
        True,
    )
    rest = oneshot.get(url, params={"since": 2}, headers=auth).json()
    assert (len(rest["manifests"]), rest["next_since"], rest["more"]) == (1, 3, False)
    assert rest["epoch"] == page["epoch"]
    # The bootstrap's newest-first cursor takes the same care: a version past SQLite's
    # INTEGER was a 500 with two tracebacks (OverflowError), other digits than ASCII passed.
    newest = node.internal_url + "/_internal/bootstrap/manifests"
    for after in (
        "99999999999999999999999:a",
        "9223372036854775808:a",
        "\u0661\u0661:a",
        ":a",
        "1:",
    ):
        r = oneshot.get(newest, params={"order": "newest", "after": after}, headers=auth)
        assert r.status_code == 400, (after, r.status_code, r.text)
        assert "is not <version_ms>:<artifact_id>" in r.text, (after, r.text)
    r = oneshot.get(
        newest, params={"order": "newest", "after": "9223372036854775807:a"}, headers=auth
    )
    assert r.status_code == 200, r.text
    # A peer asking this node to pull its feed (mesh.catch_up) must name itself, and be a peer.
    pull = url + "/pull"
    assert oneshot.post(pull, headers={"Kura-Node": "http://127.0.0.1:1"}).status_code == 401
    r = oneshot.post(pull, headers=auth)
    assert (r.status_code, "Kura-Node must name" in r.text) == (400, True), r.text
    r = oneshot.post(pull, headers={**auth, "Kura-Node": "http://127.0.0.1:1"})
    assert (r.status_code, "is not a peer" in r.text) == (404, True), r.text
    assert "Traceback" not in node.log()


def test_a_forgotten_peer_that_returns_empty_is_caught_up_by_its_full_bootstrap(
    tmp_path: Path,
) -> None:
    mesh = Mesh(tmp_path, 2, in_process=True, **COMMON)
    try:
        mesh.wait_ready()
        a, b = mesh.nodes
        first = write(a, "first", 20)
        assert wait_for(lambda: len(manifests(b)) == 20, 60)
        stop_and_get_forgotten(a, b)
        missed = write(a, "missed", 10)
        shutil.rmtree(b.data_dir)  # it comes back without data and without a cursor
        b = mesh.restart(1)
        assert wait_for(lambda: len(manifests(b)) == 30, 60), len(manifests(b))
        assert_serves(b, {**first, **missed})
        assert metadata(b, "requests", "bootstrap") > 0
        # Its full bootstrap (the head read, the walk, the pull from that head) cleared A's mark.
        assert wait_for(lambda: peer_row(a, b.internal_url)["needs_catch_up"] is False, 30)
        assert "caught up by pulling our change feed" in a.log()
    finally:
        rcs = mesh.stop_all()
        assert all(rc == 0 for rc in rcs), rcs
