"""A peer's copy that claims to be inline is held to the inline limit.

Inline bodies are read into memory and stored in SQLite, outside the tmp budget, so a replica
marked ``"inline": true`` must be no larger than a local inline write (``KURA_MAX_KEYVALUE_BYTES``)
— otherwise any peer could bypass the staging budget with one flag (found by a newcomer's
hostile pass: a 100 MiB inline replica was applied with 0 reserved bytes and 300 MiB of RSS)."""

from __future__ import annotations

import hashlib
import json
import time

import httpx
import pytest

from kura.core.keys import artifact_id
from tests import oneshot
from tests.conftest import NodeProcess

pytestmark = pytest.mark.in_process

KiB = 1024


def _put_replica(node: NodeProcess, key: str, body: bytes, *, inline: bool) -> httpx.Response:
    now = int(time.time() * 1000)
    manifest = {
        "artifact_id": artifact_id("xcode", "default", "ns", key),
        "producer": "xcode",
        "namespace_id": "ns",
        "key": key,
        "content_type": "application/json",
        "size": len(body),
        "sha256": hashlib.sha256(body).hexdigest(),
        "version_ms": now,
        "created_at_ms": now,
        "inline": inline,
    }
    return oneshot.put(
        node.internal_url + "/_internal/replicate/artifact",
        content=body,
        headers={"Kura-Manifest": json.dumps(manifest, separators=(",", ":"))},
        timeout=30,
    )


def test_an_inline_replica_over_the_inline_limit_is_413_and_leaves_nothing(
    start_node: object,
) -> None:
    node = start_node(max_keyvalue_bytes=64 * KiB, tmp_dir_max_bytes=1024 * KiB)  # type: ignore[operator]
    big = b"x" * (512 * KiB)  # within the tmp budget, over the inline limit
    r = _put_replica(node, "action_cache/big", big, inline=True)
    assert r.status_code == 413, r.text
    assert "inline limit" in r.json()["message"]
    assert node.index_rows() == 0
    assert node.staging_files() == []
    assert node.metric("kura_tmp_reserved_bytes") == 0
    # The same bytes as a file-backed copy go through the tmp budget and are applied.
    assert _put_replica(node, "blob/big", big, inline=False).status_code == 204
    # A small inline copy is still applied.
    small = b'{"entries":[]}'
    assert _put_replica(node, "action_cache/small", small, inline=True).status_code == 204
    assert node.index_rows() == 2
