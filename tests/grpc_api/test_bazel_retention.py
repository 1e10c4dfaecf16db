"""Real Bazel 4.2.3 (Debian) building without the bytes (``--remote_download_minimal``) against
kura over ``grpc://`` under eviction pressure (issue 28 item 7): a node with a 1 MiB disk budget,
20 builds of changing targets that upload 1.2 MiB each, ``bazel clean --expunge`` between them.
Each build's one cached action (``//:lib``) is a remote hit whose output Bazel does not download
at the hit; it fetches it only when a later action of the same build needs it, after that build's
own uploads. The driver is ``tests/clients/bazel_retention.sh`` (its header says how).

With the retention floor (``KURA_MIN_RETENTION``, default 3 h) every build passes and the floor
holds (``kura_retention_evictions_total`` 0) while the budget evicts dozens of other blobs. With
the floor off the first build fails with Bazel's "lost inputs" error: the uploads pushed the
output kura had just reported out of the cache (what main does, where a hit only touched the LRU).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

import pytest

from kura_harness.launch.process import free_port
from tests.conftest import NodeProcess
from tests.integration.test_clients import Client, run_client

pytestmark = [pytest.mark.clients, pytest.mark.in_process]

BUILDS = 20
BUDGET = 1024 * 1024  # each build uploads 4 x 300 KiB
LOOP = Client("bazel-retention", "bazel_retention.sh", "", "grpc", env={"BUILDS": str(BUILDS)})
LOST_INPUTS = "does not exist remotely"  # Bazel 4.2's "Failed to fetch file ..." lost input


def run_loop(start_node: Callable[..., NodeProcess], **settings: object) -> tuple[NodeProcess, str]:
    port = free_port()
    node = start_node(grpc_port=port, max_disk_bytes=BUDGET, inline_max_bytes=0, **settings)
    # 20 builds, each starting a Bazel server: 145-170 s on 2 loaded cores; a guard, not a goal.
    run = run_client(LOOP, dataclasses.replace(node, url=f"grpc://127.0.0.1:{port}"), timeout=480)
    print(f"{LOOP.script}: {run.describe()}")
    return node, run.describe()


def test_builds_without_the_bytes_pass_under_eviction_pressure_only_with_the_floor(
    start_node: Callable[..., NodeProcess],
) -> None:
    """One test for both runs, so that it fails on main (where the first run fails) and the
    contrast is always shown. The run without the floor stops at its first failure."""
    node, run = run_loop(start_node, name="floor")
    assert f"ALL {BUILDS} BUILDS OK" in run, run + "\n--- node log ---\n" + node.log()[-3000:]
    # Every build got its remote hit (//:lib), whose output it then fetched.
    assert len(re.findall(r"build \d+ ok: .*\b1 remote cache hit", run)) == BUILDS, run
    assert LOST_INPUTS not in run
    assert node.metric("kura_retention_evictions_total") == 0  # the floor held
    assert node.metric("kura_storage_evicted_bytes_total") > 10 * BUDGET  # under real pressure
    assert node.metric("kura_disk_used_bytes") <= BUDGET

    node, run = run_loop(start_node, name="no-floor", min_retention="0")
    assert "build 1 FAILED" in run, run
    assert LOST_INPUTS in run, run
    assert node.metric("kura_storage_evictions_total") > 0
