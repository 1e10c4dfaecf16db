"""``kura admin rollout-gate`` against a real 3-node mesh (issue 31; ``kura.rollout_gate``).

The nodes run in this process (``tests.inprocess``); the gate runs as the ``kura`` command a
rollout runs, in a process of its own, and is judged by its exit code and what it printed.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.mesh import Mesh, peer_row, wait_for

pytestmark = pytest.mark.in_process


@pytest.fixture
def mesh3(tmp_path: Path) -> Iterator[Mesh]:
    mesh = Mesh(tmp_path, 3, in_process=True, discovery_settle_ms=200, discovery_interval_ms=300)
    try:
        mesh.wait_ready()
        yield mesh
    finally:
        mesh.stop_all()


def gate(url: str, *mesh_urls: str, wait: float) -> subprocess.CompletedProcess[str]:
    args = ["admin", "rollout-gate", "--url", url, "--wait", str(wait)]
    if mesh_urls:
        args += ["--mesh-url", ",".join(mesh_urls)]
    return subprocess.run(
        [sys.executable, "-m", "kura.cli", *args],
        capture_output=True,
        text=True,
        timeout=wait + 60,
        check=False,
    )


def test_a_node_with_a_queue_to_a_stopped_peer_is_not_caught_up_until_it_drained(
    mesh3: Mesh,
) -> None:
    a, b, c = mesh3.nodes
    everyone = [n.url for n in mesh3.nodes]
    passed = gate(a.url, *everyone, wait=30)
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert "caught up" in passed.stdout
    # Without the other nodes' URLs their queues for it cannot be judged: not caught up.
    unchecked = gate(a.url, wait=0)
    assert unchecked.returncode == 5, unchecked.stdout
    assert f"{b.internal_url}'s queue for this node not checked" in unchecked.stdout

    assert c.stop() == 0
    with a.client() as client:
        assert client.put("/cache/while-c-is-down", content=b"x" * 5000).status_code == 201
    assert wait_for(lambda: peer_row(a, c.internal_url).get("outbox_messages") == 1, 30)
    behind = gate(a.url, *everyone, wait=3)
    assert behind.returncode == 5, behind.stdout
    verdict = behind.stdout.splitlines()[-1]
    assert verdict.startswith("not caught up after 3 s")
    assert f"{c.internal_url} (as this node sees it): 1 outbox messages queued" in verdict
    assert f"{c.internal_url} (as this node sees it): not healthy" in verdict
    # c was passed (--mesh-url) and is down: said so, not "pass that node's public URL".
    assert (
        f"{c.internal_url}'s queue for this node not checked: --mesh-url {c.url} is down or "
        "unreachable"
    ) in verdict

    back = mesh3.restart(2)
    everyone[2] = back.url
    for node in (a, back):  # the node that queued for it, and the node that was away
        caught_up = gate(node.url, *everyone, wait=120)
        assert caught_up.returncode == 0, caught_up.stdout + caught_up.stderr
    assert peer_row(a, back.internal_url)["outbox_messages"] == 0
    with back.client() as client:
        assert client.get("/cache/while-c-is-down").content == b"x" * 5000
