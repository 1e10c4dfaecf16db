"""``KURA_WORKERS=2``: public downloads a worker serves count in the primary's public load, the
signal of the peer pace (``kura.mesh.load_report``), as the primary's own do.

Real ``kura serve`` processes; each download is a fresh connection, so ``SO_REUSEPORT`` decides
which process serves it, and the worker's own ``/metrics`` tells which did.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import ExitStack

import httpx

from tests.conftest import NodeProcess
from tests.e2e.mesh import wait_for
from tests.integration.test_workers import FRESH, HIT, fresh, start_with_workers, worker_metrics

MiB = 1024 * 1024
IN_FLIGHT = "kura_public_requests_in_flight"


def test_downloads_a_worker_serves_count_in_the_nodes_public_load(
    start_node: Callable[..., NodeProcess],
) -> None:
    node = start_with_workers(start_node, "pl", workers=2)
    big = os.urandom(64 * MiB)  # far more than the socket buffers: unread, it stays in flight
    assert fresh(node, "PUT", "/cache/big", content=big).status_code in (200, 201)
    assert node.metric(IN_FLIGHT) == 0
    with ExitStack() as stack:
        opened = 0
        # Open downloads (each started, its body left unread) until the worker serves two. The
        # kernel picks the process of each connection: 8 opens were once needed for two (runs
        # alone), and 16 once gave the worker one, so up to 48 are allowed.
        while opened < 48 and (opened < 3 or worker_metrics(node).get(HIT, 0) < 2):
            client = stack.enter_context(httpx.Client(timeout=30))
            r = stack.enter_context(client.stream("GET", node.url + "/cache/big", headers=FRESH))
            assert r.status_code == 200
            opened += 1
        by_worker = worker_metrics(node).get(HIT, 0)
        assert by_worker >= 2, "the worker served none of the downloads"
        # The worker reports every second: the node counts every download, whoever serves it.
        assert wait_for(lambda: node.metric(IN_FLIGHT) == opened, 10), node.metric(IN_FLIGHT)
        factor = node.metric("kura_replication_peer_slowdown_factor")
        assert factor >= opened + 1
        print(f"{opened} downloads in flight ({by_worker:.0f} by the worker): factor {factor}")
    # Closed: the worker's next report clears its share.
    assert wait_for(lambda: node.metric(IN_FLIGHT) == 0, 10), node.metric(IN_FLIGHT)
    assert node.metric("kura_replication_peer_slowdown_factor") == 1.0
