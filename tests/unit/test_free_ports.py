"""Ports for servers told their port before they start: picked below the ephemeral range, so
that no ``bind(port 0)`` or outgoing connection of the run can take one in between."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from kura_harness.launch.process import free_port, free_ports, reserved_port_range, worker_slice


def test_the_range_is_the_half_below_the_ephemeral_start(tmp_path: Path) -> None:
    f = tmp_path / "ip_local_port_range"
    f.write_text("32768\t60999\n")
    assert reserved_port_range(f) == range(16384, 32768)
    f.write_text("1500 60999\n")
    assert reserved_port_range(f) == range(1024, 1500)
    f.write_text("junk\n")
    assert reserved_port_range(f) == range(0)
    assert reserved_port_range(tmp_path / "missing") == range(0)


def test_ports_are_distinct_outside_the_ephemeral_range_and_never_handed_out_twice() -> None:
    pool = reserved_port_range()
    assert pool, "this machine's /proc/sys/net/ipv4/ip_local_port_range could not be read"
    first = free_ports(20)
    second = [*free_ports(20), free_port()]
    assert len(set(first + second)) == 41
    assert all(p in pool for p in first + second)
    for port in first + second:  # each one is bindable right now
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_a_port_someone_holds_is_skipped_and_a_full_range_raises() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(OSError, match="only 0 of 1 ports free"):
            free_ports(1, range(port, port + 1))


def test_without_a_range_the_os_chooses() -> None:
    ports = free_ports(3, range(0))
    assert len(set(ports)) == 3
    assert all(p > 0 for p in ports)


def test_each_test_run_worker_picks_from_a_slice_of_its_own() -> None:
    pool = range(16384, 32768)
    slices = [
        worker_slice(pool, {"PYTEST_XDIST_WORKER": f"gw{i}", "PYTEST_XDIST_WORKER_COUNT": "3"})
        for i in range(3)
    ]
    assert [len(s) for s in slices] == [len(pool) // 3] * 3
    for i, a in enumerate(slices):
        for b in slices[i + 1 :]:
            assert not set(a) & set(b)
        assert set(a) <= set(pool)
    assert worker_slice(pool, {}) == pool  # not a test-run worker (kura dev, the demo)
    assert worker_slice(pool, {"PYTEST_XDIST_WORKER": "gw5", "PYTEST_XDIST_WORKER_COUNT": "3"}) == (
        pool
    )
