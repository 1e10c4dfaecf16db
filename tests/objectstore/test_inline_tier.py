"""The object-storage tier with inline rows: a small body stored inline in the index is uploaded
to the bucket like a file-backed one, and a fresh node sharing the bucket fills it back inline
(and the large one as a file), serving the same bytes (``KURA_INLINE_MAX_BYTES``)."""

from __future__ import annotations

import os

from tests.e2e.mesh import wait_for
from tests.inline_index import stored_as
from tests.objectstore.conftest import TierNode, get, put, tier_metric

KiB = 1024
THRESHOLD = 16 * KiB


def test_an_inline_row_is_uploaded_and_filled_back_inline(tier_node: TierNode) -> None:
    a = tier_node("a", prefix="inline", inline_max_bytes=THRESHOLD)
    bodies = {
        "small": os.urandom(3 * KiB),
        "edge": os.urandom(THRESHOLD),
        "large": os.urandom(200 * KiB),
    }
    for key, body in bodies.items():
        assert put(a, key, body) == 201
    assert stored_as(a, bodies["small"]) == "inline"
    assert stored_as(a, bodies["large"]) == "file"
    assert wait_for(lambda: a.metric("kura_object_store_upload_queue_messages") == 0, 30)
    uploaded = tier_metric(a, "kura_object_store_uploaded_bytes_total")
    assert uploaded == sum(map(len, bodies.values()))

    b = tier_node("b", prefix="inline", inline_max_bytes=THRESHOLD)  # empty disk, same bucket
    assert b.index_rows() == 0
    for key, body in bodies.items():
        r = get(b, key)
        assert r.status_code == 200, (key, r.text)
        assert r.content == body
        assert stored_as(b, body) == ("inline" if len(body) <= THRESHOLD else "file"), key
    assert tier_metric(b, "kura_object_store_filled_bytes_total") == uploaded
    assert len(b.blob_files()) == 1
    assert b.staging_files() == []
