"""Peer body traffic yields to public load (``kura.mesh.peer_pace``), between real nodes.

A serving node under public GET load sends its peer bodies slower than when quiet, measured in
bytes/s on both runs in the same test; a bootstrap from it under constant public load still
completes with every artifact byte-identical, within the joiner's tmp budget.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests import oneshot
from tests.conftest import NodeProcess
from tests.e2e.mesh import free_port, manifests, status, wait_for
from tests.e2e.test_bootstrap import assert_full_budget_reservable, fill, start_joiner
from tests.e2e.tmpwatch import TmpWatcher

KiB = 1024
MiB = 1024 * KiB


@contextmanager
def public_get_load(
    node: NodeProcess, keys: list[str], clients: int, read_bytes_per_second: float = 0
) -> Iterator[list[int]]:
    """``clients`` threads GET ``keys`` from ``node``'s public port in a loop until the block
    ends, each reading its body at ``read_bytes_per_second`` (0 = as fast as it can: slow
    readers keep their downloads in flight); yields a one-item list counting the GETs begun."""
    stop = threading.Event()
    ok = [0]
    failures: list[str] = []

    def read(c: httpx.Client, key: str) -> None:
        started, got = time.monotonic(), 0
        with c.stream("GET", f"/cache/{key}") as r:
            if r.status_code != 200:
                failures.append(f"{r.status_code}")
                return
            ok[0] += 1
            for chunk in r.iter_bytes(64 * KiB):
                got += len(chunk)
                if stop.is_set():
                    return
                if read_bytes_per_second > 0:  # shaping the load, not waiting on a condition
                    time.sleep(max(0.0, got / read_bytes_per_second - (time.monotonic() - started)))

    def loop(offset: int) -> None:
        with node.client() as c:
            i = offset
            while not stop.is_set():
                read(c, keys[i % len(keys)])
                i += 1

    threads = [threading.Thread(target=loop, args=(n,), daemon=True) for n in range(clients)]
    for t in threads:
        t.start()
    try:
        yield ok
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert not failures, failures[:5]


def peer_fetch_bytes_per_second(node: NodeProcess, bodies: dict[str, bytes]) -> float:
    """Fetch every body one after the other, the way a bootstrapping peer does; check each;
    their bytes/s together."""
    ids = {m["key"]: aid for aid, m in manifests(node).items()}
    started = time.perf_counter()
    with httpx.Client(base_url=node.internal_url, timeout=120) as c:
        for key, body in bodies.items():
            r = c.get(f"/_internal/bootstrap/artifacts/{ids[key]}")
            assert r.status_code == 200
            assert r.content == body
    return sum(map(len, bodies.values())) / (time.perf_counter() - started)


def artifact_id_of(node: NodeProcess, key: str) -> str:
    ids = [aid for aid, m in manifests(node).items() if m["key"] == key]
    assert len(ids) == 1, ids
    return ids[0]


BASE = 8 * MiB  # the serving node's shared peer rate, well below what loopback sustains


def test_peer_bodies_are_served_slower_under_public_load(
    start_node: Callable[..., NodeProcess],
) -> None:
    server = start_node("server", replication_shared_bandwidth_bytes_per_second=BASE)
    peer_bodies = fill(server, "peer", 8, 1 * MiB)
    public = list(fill(server, "public", 1, 64 * MiB))

    # Quiet: factor 1, nothing in flight; the bodies go out at the base rate. (The fill's
    # uploads gave no latency samples: their bodies are larger than 64 KiB.)
    assert server.metric("kura_replication_peer_slowdown_factor") == 1.0
    assert server.metric("kura_public_requests_in_flight") == 0
    quiet = peer_fetch_bytes_per_second(server, peer_bodies)

    factors: list[float] = []
    # Three clients downloading 64 MiB at 4 MiB/s each: three public requests always in
    # flight, so the factor is 4 (in flight + 1; their time to first byte is far below 100 ms).
    with public_get_load(server, public, clients=3, read_bytes_per_second=4 * MiB) as served:
        assert wait_for(lambda: server.metric("kura_public_requests_in_flight") == 3, 30)
        for _ in range(20):
            factors.append(server.metric("kura_replication_peer_slowdown_factor"))
        loaded = peer_fetch_bytes_per_second(server, peer_bodies)
    waited_loaded = server.metric("kura_replication_peer_pace_wait_seconds_total")
    print(
        f"8 peer bodies of 1 MiB: quiet {quiet / MiB:.1f} MiB/s, under 3 slow GETs "
        f"{loaded / MiB:.1f} MiB/s (ratio {quiet / loaded:.1f}), factors seen {max(factors):.2f}, "
        f"{served[0]} public GETs"
    )
    # Quiet: the whole base (bodies are paid for at the base rate, factor 1), not less.
    assert quiet > 0.75 * BASE, "a quiet node must not slow peer traffic below the base"
    assert max(factors) >= 4.0
    # Under load: the base divided by the factor (4 here: 4x slower), a clear ratio with a
    # margin for a loaded machine.
    assert quiet / loaded > 2
    assert waited_loaded > 0
    # Once the load stops, the factor returns to 1 (in flight 0; the EWMA is far below 100 ms).
    assert wait_for(lambda: server.metric("kura_replication_peer_slowdown_factor") == 1.0, 10)


def test_a_read_through_fetch_is_slowed_neither_by_load_nor_by_the_bootstrap_limit(
    start_node: Callable[..., NodeProcess],
) -> None:
    server = start_node(
        "server",
        replication_shared_bandwidth_bytes_per_second=2 * MiB,
        replication_bandwidth_limit_bytes_per_second=1 * MiB,  # the fixed bootstrap limit
    )
    big = fill(server, "peer", 1, 8 * MiB)
    public = list(fill(server, "public", 1, 64 * MiB))
    aid = artifact_id_of(server, "peer/000")
    with public_get_load(server, public, clients=3, read_bytes_per_second=4 * MiB):
        assert wait_for(lambda: server.metric("kura_public_requests_in_flight") == 3, 30)
        assert server.metric("kura_replication_peer_slowdown_factor") >= 4.0
        started = time.perf_counter()
        r = oneshot.get(
            f"{server.internal_url}/_internal/bootstrap/artifacts/{aid}",
            headers={"Kura-Read-Through": "1"},
            timeout=60,
        )
        elapsed = time.perf_counter() - started
    assert r.content == big["peer/000"]
    # Paced, 8 MiB at 2 MiB/s / 4 (raised to the 1 MiB/s floor), or at the fixed 1 MiB/s
    # limit, would take 8 s.
    assert elapsed < 6.0, f"read-through fetch took {elapsed:.1f} s"


def test_a_bootstrap_under_constant_public_load_completes(
    start_node: Callable[..., NodeProcess], tmp_path: Path
) -> None:
    budget = 2 * MiB
    server = start_node("server", replication_shared_bandwidth_bytes_per_second=8 * MiB)
    bodies = fill(server, "boot", 24, 256 * KiB)  # 6 MiB
    bodies.update(fill(server, "small", 40, 2 * KiB))  # batched bodies (POST .../bodies)
    public = list(fill(server, "public", 1, 64 * MiB))
    joiner_dir = tmp_path / "joiner"
    # Constant load: three slow downloads always in flight (factor 4: 2 MiB/s left for peers).
    with public_get_load(server, public, clients=3, read_bytes_per_second=4 * MiB) as served:
        assert wait_for(lambda: server.metric("kura_public_requests_in_flight") == 3, 30)
        started = time.monotonic()
        with TmpWatcher(joiner_dir / "tmp") as watcher:
            joiner = start_joiner(
                joiner_dir,
                [server.internal_url],
                tmp_dir_max_bytes=budget,
                replication_shared_bandwidth_bytes_per_second=8 * MiB,
            )
            assert wait_for(lambda: status(joiner)["ready"] is True, 180), status(joiner)
        took = time.monotonic() - started
    waited = server.metric("kura_replication_peer_pace_wait_seconds_total")
    print(
        f"bootstrap of {len(bodies)} artifacts under load: {took:.1f} s, server paced "
        f"{waited:.1f} s, tmp peak {watcher.peak} of {budget}, {served[0]} public GETs"
    )
    try:
        assert waited > 0, "the serving node did not slow its bodies under load"
        assert watcher.peak <= budget
        held = {m["key"]: m["sha256"] for m in manifests(joiner).values()}
        with joiner.client() as c:
            for key, body in bodies.items():
                assert held.get(key) == hashlib.sha256(body).hexdigest(), key
                assert c.get(f"/cache/{key}").content == body, key
        assert joiner.metric("kura_tmp_waiting_reservations") == 0
        assert_full_budget_reservable(joiner, budget)
    finally:
        joiner.stop()


def test_a_joiner_under_its_own_public_load_paces_its_downloads_and_completes(
    start_node: Callable[..., NodeProcess], tmp_path: Path
) -> None:
    """The receiving side: the joiner's own clients slow its bootstrap downloads."""
    joiner_dir = tmp_path / "joiner"
    # Seed the joiner with what its clients will read, then restart it with a peer that does
    # not exist yet, so its load is running before bootstrap starts.
    seed = start_joiner(joiner_dir, [])
    public = list(fill(seed, "public", 1, 64 * MiB))
    seed.stop()
    server_port = free_port()
    server_url = f"http://127.0.0.1:{server_port}"
    joiner = start_joiner(
        joiner_dir,
        [server_url],
        tmp_dir_max_bytes=2 * MiB,
        replication_shared_bandwidth_bytes_per_second=8 * MiB,
        discovery_initial_timeout_ms=60000,
    )
    try:
        with public_get_load(joiner, public, clients=3, read_bytes_per_second=4 * MiB):
            assert wait_for(lambda: joiner.metric("kura_public_requests_in_flight") == 3, 30)
            # The server itself never paces (target 0): only the joiner can slow the bodies.
            server = start_node(
                "server", internal_port=server_port, replication_public_latency_target_ms=0
            )
            bodies = fill(server, "boot", 24, 256 * KiB)
            started = time.monotonic()
            assert wait_for(lambda: len(manifests(joiner)) >= len(bodies) + 1, 120)
            assert wait_for(lambda: status(joiner)["ready"] is True, 60), status(joiner)
            took = time.monotonic() - started
        waited = joiner.metric("kura_replication_peer_pace_wait_seconds_total")
        paced = joiner.metric("kura_replication_peer_paced_bytes_total")
        print(
            f"joiner under load: 6 MiB in {took:.1f} s, paced {paced:.0f} B, waited {waited:.1f} s"
        )
        assert server.metric("kura_replication_peer_pace_wait_seconds_total") == 0
        assert paced >= 6 * MiB
        assert waited > 0, "the joiner did not slow its downloads under its own load"
        held = {m["key"]: m["sha256"] for m in manifests(joiner).values()}
        with joiner.client() as c:
            for key, body in bodies.items():
                assert held.get(key) == hashlib.sha256(body).hexdigest(), key
                assert c.get(f"/cache/{key}").content == body, key
    finally:
        joiner.stop()
