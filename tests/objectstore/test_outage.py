"""Store outages meeting a full disk or a hung store (issue 26 items 5 and 6), in real processes.

* The store down while the node's real (small, loop-mounted ext4) disk fills with writes whose
  uploads are pending, and then with a file beside them: writes answer 503 once the disk
  reaches ``KURA_MIN_FREE_DISK_BYTES``,
  ``/ready`` is 503 and says why, and once the store answers again the queue drains by itself, eviction
  frees the disk and writes are taken again, with every acknowledged write in the bucket (0
  lost). On f8bb892 the queue waited for free space only its uploads could make: 0 uploads.
* Peer replication's queue the same way (no object store): a peer down while the sender's disk
  fills and then goes below the floor; once the peer starts, the sender ships every
  acknowledged write to it (on f8bb892 its queue waited for free space too: 0 shipped).
* The real SeaweedFS SIGSTOPped (a hung store): after the first timeouts, a local miss answers
  within 1 s (the circuit breaker, ``storage.breaker``), ``/ready`` names the store as
  unreachable, and once it is SIGCONTed a probe closes the breaker and fills work again. On
  f8bb892 every miss waited the whole ``KURA_OBJECT_STORE_TIMEOUT``.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kura_harness.launch.seaweedfs import SeaweedFS
from tests import oneshot
from tests.conftest import NodeProcess, node_env, spawn_node, stop_nodes
from tests.e2e.mesh import free_port, status, wait_for
from tests.integration.ext4 import Ext4Image
from tests.objectstore.conftest import TierNode, get, put, tier_env, tier_metric
from tests.objectstore.faultproxy import FaultProxy

pytestmark = pytest.mark.own_seaweedfs  # SeaweedFS is killed or stopped here

QUEUE = "kura_object_store_upload_queue_messages"
STALLED = "kura_object_store_upload_queue_stalled"
MiB = 1024 * 1024


def ready_warnings(node: NodeProcess) -> list[str]:
    return list(oneshot.get(f"{node.url}/ready", timeout=10).json()["warnings"])


def not_ready_for_disk(node: NodeProcess) -> bool:
    """``/ready`` is 503 naming the full disk (its writes are refused)."""
    r = oneshot.get(f"{node.url}/ready", timeout=10)
    return r.status_code == 503 and any("disk full" in x for x in r.json()["reasons"])


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Ext4Image]:
    """A real 32 MiB ext4 filesystem (``tests.integration.ext4``), unmounted after the test."""
    image = Ext4Image(tmp_path / "fs.img", tmp_path / "fs", size_bytes=32 * MiB)
    yield image
    if image.mounted:
        os.system(f"umount -l {image.mountpoint}")  # a node left running still holds files


def test_store_down_with_the_disk_full_drains_by_itself_once_the_store_returns(
    seaweedfs: SeaweedFS, fault_proxy: FaultProxy, tier_node: TierNode, small_disk: Ext4Image
) -> None:
    directory = small_disk.mountpoint / "node"
    env = tier_env(
        seaweedfs,
        directory,
        prefix="fulldisk",
        endpoint=fault_proxy.endpoint,
        object_store_timeout="2s",
        object_store_breaker_cooldown="1s",
        replication_backoff_max_ms=1000,
        max_disk_bytes=2 * MiB,
        min_free_disk_bytes=16 * MiB,  # of about 30 MiB: the disk is full after ~14 MiB
    )
    a = spawn_node(directory, env)
    try:
        fault_proxy.set_mode("refuse")  # the store is down
        acked = fill_until_refused(a, small_disk, 16 * MiB)
        assert len(acked) >= 8  # over the 2 MiB budget: nothing could be evicted
        assert wait_for(lambda: tier_metric(a, QUEUE) >= len(acked), 30)  # none uploaded
        said = wait_for(lambda: any("disk is full" in w for w in ready_warnings(a)), 30)
        not_ready = not_ready_for_disk(a)
        logged = wait_for(lambda: "upload queue stalled" in a.log(), 10)
        gauged = tier_metric(a, STALLED) == 1

        fault_proxy.set_mode("pass")  # the store is back; nothing else is done to the node
        started = time.monotonic()
        assert wait_for(lambda: tier_metric(a, QUEUE) == 0, 60), (
            f"queue {tier_metric(a, QUEUE)} of {len(acked)}: {a.log()[-3000:]}"
        )
        drained_s = time.monotonic() - started
        assert said, "while it was stuck, /ready did not say why"
        assert not_ready, "while writes were refused, /ready was not 503 naming the disk"
        assert logged, "while it was stuck, no log line said why"
        assert gauged, "while it was stuck, no metric said so"
        assert wait_for(lambda: tier_metric(a, STALLED) == 0, 30)
        # The uploads made the artifacts evictable and eviction freed the disk: writes resume.
        assert wait_for(lambda: put(a, "full/after", b"x" * 300_000) in (200, 201), 30)
        assert wait_for(lambda: ready_warnings(a) == [], 30), ready_warnings(a)
        assert wait_for(lambda: oneshot.get(f"{a.url}/ready", timeout=10).status_code == 200, 30)
    finally:
        stop_nodes([a])

    b = tier_node("b", prefix="fulldisk")  # an empty node: every byte comes from the bucket
    lost = [k for k, body in acked.items() if get(b, k).content != body]
    assert lost == [], f"{len(lost)} of {len(acked)} acknowledged writes lost"
    print(f"acked={len(acked)} drained_in={drained_s:.1f}s lost=0")


def fill_until_refused(node: NodeProcess, disk: Ext4Image, floor_bytes: int) -> dict[str, bytes]:
    """PUT 512 KiB bodies until the node answers 503 (its disk at the free-space floor), then
    fill what is left above ``floor_bytes`` with a file beside the node's (a log, another
    program). Returns the acknowledged writes."""
    acked: dict[str, bytes] = {}
    statuses: list[int] = []
    for i in range(60):  # 60 x 512 KiB = 30 MiB: more than the disk holds
        body = os.urandom(512 * 1024)
        status_code = put(node, f"full/{i}", body)
        statuses.append(status_code)
        if status_code in (200, 201):
            acked[f"full/{i}"] = body
        elif status_code == 503:
            break
    assert statuses[-1] == 503, statuses
    with (disk.mountpoint / "filler").open("wb") as f:
        f.write(b"\0" * (shutil.disk_usage(disk.mountpoint).free - floor_bytes + MiB))
        os.fsync(f.fileno())
    assert shutil.disk_usage(disk.mountpoint).free < floor_bytes
    return acked


def test_a_peer_down_with_the_disk_full_gets_every_write_once_it_returns(
    tmp_path: Path, small_disk: Ext4Image
) -> None:
    port = free_port()  # the receiver's internal port, before it runs
    directory = small_disk.mountpoint / "sender"
    env = node_env(
        directory,
        max_disk_bytes=1024 * MiB,  # only the floor limits the disk
        min_free_disk_bytes=16 * MiB,
        replication_backoff_max_ms=1000,
    )
    env["KURA_PEERS"] = f"http://127.0.0.1:{port}"
    sender = spawn_node(directory, env)
    nodes = [sender]
    try:
        acked = fill_until_refused(sender, small_disk, 16 * MiB)
        assert len(acked) >= 8
        assert not_ready_for_disk(sender)
        assert status(sender)["outbox_messages"] >= len(acked)
        receiver_env = node_env(tmp_path / "receiver")
        receiver_env["KURA_INTERNAL_PORT"] = str(port)
        receiver = spawn_node(tmp_path / "receiver", receiver_env)  # no peers: no bootstrap
        nodes.append(receiver)
        started = time.monotonic()
        assert wait_for(lambda: status(sender)["outbox_messages"] == 0, 60), (
            f"{status(sender)['outbox_messages']} of {len(acked)} unshipped: {sender.log()[-3000:]}"
        )
        shipped_s = time.monotonic() - started
        lost = [k for k, body in acked.items() if get(receiver, k).content != body]
        assert lost == [], f"{len(lost)} of {len(acked)} acknowledged writes never shipped"
        print(f"acked={len(acked)} shipped_in={shipped_s:.1f}s lost=0")
    finally:
        stop_nodes(nodes)


def test_a_hung_store_costs_a_miss_under_a_second_after_the_first_timeouts(
    seaweedfs: SeaweedFS, tier_node: TierNode
) -> None:
    writer = tier_node("w", prefix="hung")
    assert put(writer, "there", b"in the bucket" * 1000) in (200, 201)
    assert wait_for(lambda: tier_metric(writer, QUEUE) == 0, 30)
    a = tier_node(
        "a",
        prefix="hung",
        object_store_timeout="2s",
        object_store_breaker_failures=2,
        object_store_breaker_cooldown="2s",
    )
    assert seaweedfs.proc is not None
    os.killpg(seaweedfs.proc.pid, signal.SIGSTOP)  # the store hangs: connects, never answers
    try:
        first: list[float] = []
        for i in range(2):  # these wait for the timeout: the breaker has not seen a failure yet
            started = time.monotonic()
            assert get(a, f"miss/{i}").status_code == 404
            first.append(time.monotonic() - started)
        later: list[float] = []
        until = time.monotonic() + 6  # two cool-downs: the probes meanwhile delay no miss
        while time.monotonic() < until or len(later) < 10:
            started = time.monotonic()
            assert get(a, f"miss/{len(later) + 2}").status_code == 404
            later.append(time.monotonic() - started)
        assert min(first) >= 1.5, first  # the timeouts really happened
        assert max(later) < 1.0, later
        assert any("unreachable" in w for w in ready_warnings(a)), ready_warnings(a)
        assert tier_metric(a, "kura_object_store_circuit_open") == 1
        assert oneshot.get(f"{a.url}/status", timeout=10).json()["object_store"]["unreachable"]
    finally:
        os.killpg(seaweedfs.proc.pid, signal.SIGCONT)
    # Transient: once the store answers, a probe after the cool-down closes the breaker.
    assert wait_for(lambda: get(a, "there").status_code == 200, 30), a.log()[-3000:]
    assert wait_for(lambda: not any("unreachable" in w for w in ready_warnings(a)), 10)
    assert tier_metric(a, "kura_object_store_circuit_open") == 0
    print(f"first misses {first} s, then {len(later)} at most {max(later):.3f} s")
