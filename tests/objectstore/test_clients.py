"""Real Nx, Turborepo and ccache through a node backed by the bucket (real SeaweedFS).

Each client's driver script (``tests/clients/``, the same ones ``tests/integration`` runs) builds
twice against node ``a``, whose only durable tier is the bucket, and must get its remote hit.
Then node ``b`` (an empty disk, the same bucket, not a peer, no bootstrap) is ready at once and
serves every artifact the client stored, through the client's own route, byte-identical:
``b`` fills each from the bucket (a GET ``b`` answers is the hit the client would get).
"""

from __future__ import annotations

import sqlite3

import pytest

from tests import oneshot
from tests.conftest import NodeProcess
from tests.e2e.mesh import wait_for
from tests.integration.test_clients import BY_NAME, assert_remote_hit, run_client
from tests.objectstore.conftest import TierNode, tier_metric

pytestmark = pytest.mark.clients

QUEUE = "kura_object_store_upload_queue_messages"
# producer -> the client route serving an artifact of (namespace, key).
ROUTES = {
    "nx": lambda ns, key: f"/v1/cache/{key}",
    "turbo": lambda ns, key: f"/v8/artifacts/{key}?slug={ns}",
    "http": lambda ns, key: f"/cache/{key}",
}
HEADERS = {"Authorization": "Bearer open"}


def stored(node: NodeProcess) -> list[tuple[str, str, str]]:
    """(producer, namespace, key) of every artifact in ``node``'s index."""
    conn = sqlite3.connect(f"file:{node.data_dir / 'index.sqlite3'}?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT producer, namespace_id, key FROM artifacts").fetchall()
    finally:
        conn.close()
    return [(str(p), str(n), str(k)) for p, n, k in rows]


@pytest.mark.parametrize("name", ["nx", "turbo", "ccache"])
def test_real_client_hits_through_the_bucket_and_a_fresh_node_serves_its_artifacts(
    name: str, tier_node: TierNode
) -> None:
    client = BY_NAME[name]
    a = tier_node("a", prefix=f"clients-{name}")
    run = run_client(client, a)
    assert_remote_hit(client, a, run)
    assert wait_for(lambda: tier_metric(a, QUEUE) == 0, 60), a.log()[-3000:]
    artifacts = stored(a)
    assert artifacts, "the client stored nothing"
    assert tier_metric(a, "kura_object_store_uploaded_bytes_total") > 0

    b = tier_node("b", prefix=f"clients-{name}")
    assert oneshot.get(b.url + "/ready", timeout=10).status_code == 200
    for producer, namespace, key in artifacts:
        path = ROUTES[producer](namespace, key)
        want = oneshot.get(a.url + path, headers=HEADERS, timeout=30)
        got = oneshot.get(b.url + path, headers=HEADERS, timeout=30)
        assert want.status_code == 200, (path, want.text)
        assert got.status_code == 200, (path, got.text, b.log()[-2000:])
        assert got.content == want.content, path
    assert b.index_rows() == len(artifacts)
    assert tier_metric(b, "kura_object_store_filled_bytes_total") > 0
