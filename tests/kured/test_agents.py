"""kured agents sharing a real etcd (the reboot-coordinator issue's e2e): as real processes
where the test is about processes (a rolling reboot, a holder killed mid-reboot, ``kured status``
and ``/metrics`` of a running agent), and otherwise as the same agent built in-process from the
same flags (``tests.kured.agents.wired_agent``) on virtual time, where every "it did not reboot"
is the agent's own decision at each check, not a wait for a reboot that does not come.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from kit.clock import ManualClock
from kit.wait import wait_until
from kured.console import render, status_of
from tests.kured.agents import Host, Wired, read_events, released_at, wired_agent
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
    etcd: str, lock_key: str, tmp_path: Path
) -> None:
    events = tmp_path / "events.log"
    delay = 2.0
    hosts = [
        Host(
            tmp_path,
            f"n{i}",
            etcd,
            events,
            *COMMON,
            "--lock-release-delay",
            "2s",
            lock_key=lock_key,
        )
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
        # No loop: every agent's own decision is that no reboot is required any more.
        assert wait_for(lambda: all(h.status()["reason"] == "not_required" for h in hosts), 30)
        assert sum(1 for e in read_events(events) if e[2] == "reboot") == 3
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
    etcd: str, lock_key: str, tmp_path: Path, prometheus: Prometheus
) -> None:
    events = tmp_path / "events.log"
    host = Host(
        tmp_path, "n0", etcd, events, *COMMON, "--prometheus-url", prometheus.url, lock_key=lock_key
    )
    host.sentinel.touch()
    try:
        host.start()
        assert wait_for(lambda: host.status()["reason"] == "gate_blocked", 30), host.status()
        assert read_events(events) == [e for e in read_events(events) if e[2] == "boot"]
        out = kured_status(host)
        assert out.returncode == 3
        assert "blocked: alert NodeDiskPressure firing" in out.stdout
        metrics = __import__("httpx").get(host.url + "/metrics").text
        assert 'kured_blocking_reason{node="n0",reason="gate_blocked"} 1.0' in metrics
        assert 'kured_reboot_required{node="n0"} 1.0' in metrics
    finally:
        host.stop()


async def test_a_firing_alert_blocks_at_every_check(
    etcd: str, lock_key: str, tmp_path: Path, prometheus: Prometheus
) -> None:
    flags = ("--etcd-endpoints", etcd, "--lock-key", lock_key, "--prometheus-url", prometheus.url)
    async with wired_agent(tmp_path, "n0", *COMMON, *flags) as host:
        host.sentinel.touch()
        said = await host.check(times=5)  # five periods of virtual time
        assert said == ["nothing: gate_blocked"] * 5
        assert host.rebooter.calls == 0
        assert "NodeDiskPressure" in host.agent.view.decision.first  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("match_only", "blocks"),
    [
        ("false", False),  # the regexp is an ignore list: NodeDiskPressure is ignored
        ("true", True),
    ],  # the regexp is a block list: NodeDiskPressure blocks
)
async def test_both_meanings_of_the_alert_filter_flag(
    etcd: str, lock_key: str, tmp_path: Path, prometheus: Prometheus, match_only: str, blocks: bool
) -> None:
    flags = ("--etcd-endpoints", etcd, "--lock-key", lock_key, "--prometheus-url", prometheus.url)
    filter_flags = ("--alert-filter-regexp", "^NodeDiskPressure$")
    match = f"--alert-filter-match-only={match_only}"
    async with wired_agent(tmp_path, "n0", *COMMON, *flags, *filter_flags, match) as host:
        host.sentinel.touch()
        said = await host.check(times=3 if blocks else 1)
        if blocks:
            assert said == ["nothing: gate_blocked"] * 3
            assert "NodeDiskPressure" in host.agent.view.decision.first  # type: ignore[union-attr]
            assert host.rebooter.calls == 0
        else:
            assert said == ["reboot: none"]
            assert host.rebooter.calls == 1


async def test_an_unreachable_prometheus_blocks_with_that_reason(
    etcd: str, lock_key: str, tmp_path: Path
) -> None:
    prom = Prometheus(tmp_path / "prom", ALWAYS_FIRING)
    url = prom.url
    prom.stop()  # Prometheus is down for the whole test
    flags = ("--etcd-endpoints", etcd, "--lock-key", lock_key, "--prometheus-url", url)
    async with wired_agent(tmp_path, "n0", *COMMON, *flags, "--prometheus-timeout", "2s") as host:
        host.sentinel.touch()
        assert await host.check(times=3) == ["nothing: gate_unknown"] * 3
        assert "unreachable" in host.agent.view.decision.first  # type: ignore[union-attr]
        assert host.rebooter.calls == 0


def hanging_reboot(tmp_path: Path) -> str:
    """A reboot command that logs its reboot and never ends. kured runs it in a session of its
    own (``kit.command.run``), so killing the agent leaves it running: it writes its pid to
    ``hang.pid`` for ``end_hung_reboot``."""
    script = tmp_path / "hang.sh"
    script.write_text(
        '#!/bin/sh\necho $$ > "$(dirname "$0")/hang.pid"\n'
        'echo "$(date +%s.%N) $1 reboot" >> "$2"\nexec sleep 600\n'
    )
    script.chmod(0o755)
    return str(script)


def end_hung_reboot(tmp_path: Path) -> None:
    """Kill the command ``hanging_reboot`` started, if it did (a real reboot would have)."""
    pid_file = tmp_path / "hang.pid"
    if pid_file.exists():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(int(pid_file.read_text()), signal.SIGKILL)


def test_a_killed_holder_of_a_ttl0_lock_blocks_everyone_and_is_shown(
    etcd: str, lock_key: str, tmp_path: Path
) -> None:
    events = tmp_path / "events.log"
    a = Host(tmp_path, "a", etcd, events, *COMMON, lock_key=lock_key)
    a.argv[a.argv.index("--reboot-command") + 1] = f"{hanging_reboot(tmp_path)} a {events}"
    b = Host(tmp_path, "b", etcd, events, *COMMON, lock_key=lock_key)
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
        assert not any(e[1] == "b" and e[2] == "reboot" for e in read_events(events))
        out = kured_status(b)
        assert "a " in out.stdout
        assert "never expires" in out.stdout
    finally:
        a.stop()
        b.stop()
        end_hung_reboot(tmp_path)


@contextlib.asynccontextmanager
async def holder_gone_mid_reboot(
    tmp_path: Path, etcd: str, lock_key: str, *flags: str
) -> AsyncIterator[tuple[ManualClock, Wired]]:
    """Agent a (in-process, virtual time) takes the lock and reboots, and never comes back;
    agent b, on the same clock, needs a reboot and has checked once (the lock is a's)."""
    clock = ManualClock(now_ms=int(time.time() * 1000))
    flags = (*COMMON, "--etcd-endpoints", etcd, "--lock-key", lock_key, *flags)
    async with (
        wired_agent(tmp_path, "a", *flags, clock=clock) as a,
        wired_agent(tmp_path, "b", *flags, clock=clock) as b,
    ):
        a.sentinel.touch()
        assert await a.check() == ["reboot: none"]
        b.sentinel.touch()
        assert await b.check() == ["acquire: lock_held_elsewhere"]
        yield clock, b


async def test_a_ttl0_lock_of_a_node_that_never_comes_back_blocks_for_ever(
    etcd: str, lock_key: str, tmp_path: Path
) -> None:
    async with holder_gone_mid_reboot(tmp_path, etcd, lock_key) as (clock, b):
        clock.advance(7 * 24 * 3600)
        assert await b.check(times=3) == ["acquire: lock_held_elsewhere"] * 3
        assert b.rebooter.calls == 0
        assert "never expires" in render(status_of(b.agent, ""))


async def test_with_a_ttl_another_node_proceeds_after_the_holder_expires(
    etcd: str, lock_key: str, tmp_path: Path
) -> None:
    async with holder_gone_mid_reboot(tmp_path, etcd, lock_key, "--lock-ttl", "4s") as (clock, b):
        clock.advance(3.9)
        assert await b.check() == ["acquire: lock_held_elsewhere"]  # not before the TTL
        clock.advance(0.1)
        assert await b.check() == ["reboot: none"]  # only after a's record expired
        assert b.rebooter.calls == 1
