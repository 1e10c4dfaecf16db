"""kured agents as real processes sharing a real etcd (the reboot-coordinator issue's e2e)."""

from __future__ import annotations

import itertools
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from kit.wait import wait_until
from tests.kured.agents import Host, read_events, released_at
from tests.kured.prom import ALWAYS_FIRING, Prometheus

COMMON = ("--period", "1s", "--start-time", "0:00", "--end-time", "23:59:59")


def wait_for(predicate: Callable[[], object], timeout: float, interval: float = 0.1) -> bool:
    return wait_until(predicate, timeout, interval=interval)


def kured_status(host: Host) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kured.cli", "status", "--url", host.url],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_three_agents_reboot_strictly_one_at_a_time_with_the_release_delay(
    etcd: str, tmp_path: Path
) -> None:
    events = tmp_path / "events.log"
    delay = 2.0
    hosts = [
        Host(tmp_path, f"n{i}", etcd, events, *COMMON, "--lock-release-delay", "2s")
        for i in range(3)
    ]
    for h in hosts:
        h.sentinel.touch()
    try:
        for h in hosts:
            h.start()
        assert wait_for(
            lambda: sum(1 for e in read_events(events) if e[2] == "reboot") == 3, 120
        ), read_events(events)
        # Every agent released after its reboot (the delay then the release).
        assert wait_for(lambda: all(released_at(h.log()) for h in hosts), 30)
        assert not any(h.sentinel.exists() for h in hosts)
        history = read_events(events)
        reboots = [(t, n) for t, n, w in history if w == "reboot"]
        assert sorted({n for _, n in reboots}) == ["n0", "n1", "n2"]
        by_node = {h.node: h for h in hosts}
        for (t_prev, prev), (t_next, _nxt) in itertools.pairwise(reboots):
            release = min(t for t in released_at(by_node[prev].log()) if t > t_prev)
            boot = min(t for t, n, w in history if n == prev and w == "boot" and t > t_prev)
            # Strictly one at a time: the next reboot starts after the previous released...
            assert t_next > release, (prev, release, t_next)
            # ...and the previous node was back for at least the release delay first.
            assert t_next - boot >= delay, (prev, boot, t_next)
        time.sleep(2)
        assert sum(1 for e in read_events(events) if e[2] == "reboot") == 3  # no loop
    finally:
        for h in hosts:
            h.stop()


@pytest.fixture
def prometheus(tmp_path: Path):  # type: ignore[no-untyped-def]
    prom = Prometheus(tmp_path / "prom", ALWAYS_FIRING)
    try:
        assert wait_for(lambda: prom.firing() == ["NodeDiskPressure"], 30)
        yield prom
    finally:
        prom.stop()


def test_a_firing_alert_blocks_and_status_names_it(
    etcd: str, tmp_path: Path, prometheus: Prometheus
) -> None:
    events = tmp_path / "events.log"
    host = Host(tmp_path, "n0", etcd, events, *COMMON, "--prometheus-url", prometheus.url)
    host.sentinel.touch()
    try:
        host.start()
        assert wait_for(lambda: host.status()["reason"] == "gate_blocked", 30), host.status()
        time.sleep(3)
        assert read_events(events) == [e for e in read_events(events) if e[2] == "boot"]
        out = kured_status(host)
        assert out.returncode == 3
        assert "blocked: alert NodeDiskPressure firing" in out.stdout
        metrics = __import__("httpx").get(host.url + "/metrics").text
        assert 'kured_blocking_reason{node="n0",reason="gate_blocked"} 1.0' in metrics
        assert 'kured_reboot_required{node="n0"} 1.0' in metrics
    finally:
        host.stop()


@pytest.mark.parametrize(
    ("match_only", "blocks"),
    [
        ("false", False),  # the regexp is an ignore list: NodeDiskPressure is ignored
        ("true", True),
    ],  # the regexp is a block list: NodeDiskPressure blocks
)
def test_both_meanings_of_the_alert_filter_flag(
    etcd: str, tmp_path: Path, prometheus: Prometheus, match_only: str, blocks: bool
) -> None:
    events = tmp_path / "events.log"
    host = Host(
        tmp_path,
        "n0",
        etcd,
        events,
        *COMMON,
        "--prometheus-url",
        prometheus.url,
        "--alert-filter-regexp",
        "^NodeDiskPressure$",
        f"--alert-filter-match-only={match_only}",
    )
    host.sentinel.touch()
    try:
        host.start()
        rebooted = wait_for(
            lambda: any(e[2] == "reboot" for e in read_events(events)), 15 if blocks else 60
        )
        assert rebooted is not blocks, host.log()[-2000:]
        if blocks:
            assert "NodeDiskPressure" in host.status()["blocked_by"]
    finally:
        host.stop()


def test_an_unreachable_prometheus_blocks_with_that_reason(etcd: str, tmp_path: Path) -> None:
    events = tmp_path / "events.log"
    prom = Prometheus(tmp_path / "prom", ALWAYS_FIRING)
    url = prom.url
    prom.stop()  # Prometheus is down for the whole test
    host = Host(
        tmp_path, "n0", etcd, events, *COMMON, "--prometheus-url", url, "--prometheus-timeout", "2s"
    )
    host.sentinel.touch()
    try:
        host.start()
        assert wait_for(lambda: host.status()["reason"] == "gate_unknown", 30), host.status()
        assert "unreachable" in str(host.status()["blocked_by"])
        time.sleep(2)
        assert not any(e[2] == "reboot" for e in read_events(events))
    finally:
        host.stop()


def hanging_reboot(tmp_path: Path) -> str:
    script = tmp_path / "hang.sh"
    script.write_text('#!/bin/sh\necho "$(date +%s.%N) $1 reboot" >> "$2"\nsleep 600\n')
    script.chmod(0o755)
    return str(script)


def test_a_killed_holder_of_a_ttl0_lock_blocks_everyone_and_is_shown(
    etcd: str, tmp_path: Path
) -> None:
    events = tmp_path / "events.log"
    a = Host(tmp_path, "a", etcd, events, *COMMON)
    a.argv[a.argv.index("--reboot-command") + 1] = f"{hanging_reboot(tmp_path)} a {events}"
    b = Host(tmp_path, "b", etcd, events, *COMMON)
    a.sentinel.touch()
    try:
        a.start()
        assert wait_for(
            lambda: any(e[1] == "a" and e[2] == "reboot" for e in read_events(events)), 30
        )
        a.kill()  # hung mid-reboot and never comes back
        b.sentinel.touch()
        b.start()
        assert wait_for(lambda: b.status()["reason"] == "lock_held_elsewhere", 30), b.status()
        time.sleep(4)
        assert not any(e[1] == "b" and e[2] == "reboot" for e in read_events(events))
        out = kured_status(b)
        assert "a " in out.stdout
        assert "never expires" in out.stdout
    finally:
        a.stop()
        b.stop()


def test_with_a_ttl_another_node_proceeds_after_the_holder_expires(
    etcd: str, tmp_path: Path
) -> None:
    events = tmp_path / "events.log"
    a = Host(tmp_path, "a", etcd, events, *COMMON, "--lock-ttl", "4s")
    a.argv[a.argv.index("--reboot-command") + 1] = f"{hanging_reboot(tmp_path)} a {events}"
    b = Host(tmp_path, "b", etcd, events, *COMMON, "--lock-ttl", "4s")
    a.sentinel.touch()
    try:
        a.start()
        assert wait_for(
            lambda: any(e[1] == "a" and e[2] == "reboot" for e in read_events(events)), 30
        )
        killed_at = time.time()
        a.kill()
        b.sentinel.touch()
        b.start()
        assert wait_for(
            lambda: any(e[1] == "b" and e[2] == "reboot" for e in read_events(events)), 60
        )
        b_reboot = next(t for t, n, w in read_events(events) if n == "b" and w == "reboot")
        a_reboot = next(t for t, n, w in read_events(events) if n == "a" and w == "reboot")
        assert b_reboot - a_reboot >= 4.0  # only after a's record expired
        assert b_reboot > killed_at
    finally:
        a.stop()
        b.stop()
