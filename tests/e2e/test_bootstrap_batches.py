"""Bootstrap fetches small artifacts in batches (``POST /_internal/bootstrap/bodies``), with the
bootstrap rules intact: byte-identical copies, the tmp budget, per-artifact failures, bad input
refused, and a peer without the route still bootstrapped one artifact at a time."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from kura.core.keys import artifact_id
from kura.mesh.wire import BATCH_MAX_IDS, decode_frames
from tests import oneshot
from tests.conftest import NodeProcess
from tests.e2e.fakepeer import FakePeer, honest, lying
from tests.e2e.mesh import manifests, status, wait_for
from tests.e2e.test_bootstrap import (
    assert_full_budget_reservable,
    assert_holds,
    fill,
    is_ready,
    start_joiner,
)
from tests.e2e.tmpwatch import TmpWatcher

pytestmark = pytest.mark.in_process

KiB = 1024


def requests_to(node: NodeProcess, method: str) -> float:
    return sum(
        v
        for k, v in node.metrics().items()
        if k.startswith("kura_http_requests_total{")
        and 'protocol="internal"' in k
        and f'method="{method}"' in k
    )


def test_a_fresh_node_fetches_small_artifacts_in_batches_byte_identical(
    start_node: Callable[..., NodeProcess], tmp_path: Path
) -> None:
    peer = start_node("peer")
    small = fill(peer, "small", 600, 1 * KiB)
    large = fill(peer, "large", 3, 200 * KiB)
    budget = 256 * KiB
    with TmpWatcher(tmp_path / "j" / "tmp") as watcher:
        joiner = start_joiner(tmp_path / "j", [peer.internal_url], tmp_dir_max_bytes=budget)
        try:
            assert wait_for(lambda: is_ready(joiner), 120), status(joiner)
        except BaseException:
            joiner.stop()
            raise
    try:
        assert_holds(joiner, small | large)
        posts, gets = requests_to(peer, "POST"), requests_to(peer, "GET")
        print(
            f"603 artifacts: {posts:.0f} batch requests, {gets:.0f} GETs; peak tmp {watcher.peak}"
        )
        # Two walks of 603 manifests are a few pages; the bodies came in batches of at most
        # BATCH_MAX_IDS (and of at most a quarter of the budget): far fewer requests than bodies.
        assert 3 <= posts <= 600 * 1024 / (budget // 4) + 5
        assert gets < 100
        assert watcher.peak <= budget
        assert_full_budget_reservable(joiner, budget)
    finally:
        joiner.stop()


def test_a_wrong_body_in_a_batch_fails_alone_and_leaves_nothing(tmp_path: Path) -> None:
    good = [honest(f"good/{i}", os.urandom(2 * KiB)) for i in range(20)]
    bad = lying("bad/one", claimed=b"m" * (2 * KiB), sent=os.urandom(2 * KiB))
    with FakePeer([*good, bad], batches=True) as peer:
        joiner = start_joiner(
            tmp_path / "j", [peer.url], tmp_dir_max_bytes=64 * KiB, bootstrap_max_failed_passes=2
        )
        try:
            assert wait_for(lambda: is_ready(joiner), 60), status(joiner)
            held = {m["key"] for m in manifests(joiner).values()}
            assert held == {f"good/{i}" for i in range(20)}
            with joiner.client() as c:
                for art in good:
                    assert c.get(f"/cache/{art.manifest.key}").content == art.body
                assert c.get("/cache/bad/one").status_code == 404
            label = peer.url.split("://")[1]
            errors = joiner.metric(
                f'kura_bootstrap_artifact_results_total{{peer="{label}",result="error"}}'
            )
            assert errors >= 2  # the bad one, in each failed pass
            assert joiner.metric("kura_tmp_reserved_bytes") == 0
            assert joiner.staging_files() == []
        finally:
            joiner.stop()


def test_the_batch_route_refuses_bad_input_and_reports_absent_ids(
    start_node: Callable[..., NodeProcess],
) -> None:
    node = start_node("node")
    bodies = fill(node, "b", 3, 1 * KiB)
    big = fill(node, "big", 1, 100 * KiB)
    url = node.internal_url + "/_internal/bootstrap/bodies"
    bad_requests: list[bytes] = [
        b"not json",
        b"{}",
        json.dumps({"artifact_ids": []}).encode(),
        json.dumps({"artifact_ids": ["zz"]}).encode(),
        json.dumps({"artifact_ids": ["a" * 64] * (BATCH_MAX_IDS + 1)}).encode(),
        json.dumps({"artifact_ids": "a" * 64}).encode(),
        b"\xff\xfe{",  # not UTF-8
        b"[" * 20_000,  # nested deep enough to exhaust the parser's recursion
    ]
    for raw in bad_requests:
        r = oneshot.post(url, content=raw, timeout=10)
        assert r.status_code == 400, (raw[:40], r.status_code, r.text)
        assert r.json()["message"]
    ids = [artifact_id("http", "default", "", k) for k in [*bodies, *big]]
    unknown = "0" * 64
    r = oneshot.post(url, json={"artifact_ids": [*ids, unknown]}, timeout=10)
    assert r.status_code == 200
    frames = decode_frames(r.content)
    assert [f[0] for f in frames] == [*ids, unknown]
    assert [f[3] for f in frames] == ["ok", "ok", "ok", "large", "missing"]
    for (_aid, _m, body, _state), want in zip(frames[:3], bodies.values(), strict=True):
        assert body == want


def test_a_manifest_header_nested_too_deep_is_400_not_500(
    start_node: Callable[..., NodeProcess],
) -> None:
    node = start_node("node")
    r = oneshot.put(
        node.internal_url + "/_internal/replicate/artifact",
        headers={"Kura-Manifest": "[" * 4000},
        content=b"x",
        timeout=10,
    )
    assert r.status_code == 400, r.text
    assert "manifest" in r.json()["message"]
    assert "Traceback" not in node.log()
