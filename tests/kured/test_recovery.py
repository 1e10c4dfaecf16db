"""Never two nodes out of service (issue 15, deliver 1): a failed uncordon keeps the lock until
it succeeds, a restart during post-reboot recovery still honours ``--lock-release-delay``, and
the kernel's boot ID confirms that a reboot happened before recovery runs.

In-process agents against the Kubernetes API double (tests/kured/k8s_double.py, a documented
double: no API server runs here) and real ``kured`` processes against a real etcd.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path

from kit.clock import ManualClock
from kured.actuators.drain import DrainOptions
from kured.console import status_of
from kured.core.lockrecord import parse
from kured.core.policy import Action, Why
from kured.loop import Agent
from kured.metrics import AgentCollector, exposition, registry_for
from tests.kured.agents import Host, read_events, released_at
from tests.kured.conftest import LOCK_ANNOTATION, LOCK_DAEMONSET, LOCK_NAMESPACE
from tests.kured.k8s_double import KubeDouble
from tests.kured.kube_agent import KubeHost
from tests.kured.test_agents import COMMON, wait_for

NS, DS, KEY = LOCK_NAMESPACE, LOCK_DAEMONSET, LOCK_ANNOTATION
FAST = DrainOptions(timeout_seconds=20, poll_interval_seconds=0.05)


def holder(kube: KubeDouble) -> str | None:
    value = kube.annotation(NS, DS, KEY)
    return parse(value).entries[0].node_id if value else None


def out_of_service(kube: KubeDouble) -> list[tuple[float, float, str]]:
    """Every interval (start, end, node) during which a node was cordoned (end = +inf if still)."""
    intervals: list[tuple[float, float, str]] = []
    since: dict[str, float] = {}
    for at, node, cordoned in kube.schedulable_history:
        if cordoned and node not in since:
            since[node] = at
        elif not cordoned and node in since:
            intervals.append((since.pop(node), at, node))
    intervals += [(t, float("inf"), n) for n, t in since.items()]
    return sorted(intervals)


async def test_a_failing_uncordon_keeps_the_lock_until_it_succeeds_and_nobody_else_cordons(
    kube: KubeDouble, hosts: Callable[..., KubeHost]
) -> None:
    names = ("n1", "n2", "n3")
    for name in names:
        kube.add_node(name)
    machines = {n: hosts(n, drain=FAST, uncordon_backoff_initial_seconds=0.4) for n in names}
    for m in machines.values():
        m.sentinel.touch()
    first = await machines["n1"].boot()
    await first.tick()
    assert machines["n1"].rebooter.calls == 1
    assert holder(kube) == "n1"

    kube.fail_next_uncordons("n1", 2)
    back = await machines["n1"].boot()  # n1 came back: its recovery uncordons, then releases
    others = [await machines[n].boot() for n in ("n2", "n3")]
    recovery = asyncio.create_task(back.tick())
    held_while_cordoned: list[str | None] = []
    while not recovery.done():
        for agent in others:  # the other agents keep trying for the lock meanwhile
            await agent.tick()
        if kube.node("n1")["spec"].get("unschedulable"):
            held_while_cordoned.append(holder(kube))
        await asyncio.sleep(0.05)
    decision = await recovery

    # While n1 was cordoned the lock stayed n1's: first the safety property, then the counts.
    assert held_while_cordoned  # the loop saw n1 cordoned at least once
    assert set(held_while_cordoned) == {"n1"}, held_while_cordoned
    assert decision.action is Action.RELEASE
    assert kube.count("PATCH", "/nodes/n1$", 500) == 2
    assert back.view.failures_total["uncordon"] == 2
    n1_cordon = [(s, e) for s, e, n in out_of_service(kube) if n == "n1"]
    assert len(n1_cordon) == 1
    assert n1_cordon[0][1] != float("inf")  # the third uncordon succeeded
    # Nobody else cordoned while n1 was out of service.
    assert all(s >= n1_cordon[0][1] for s, _, n in out_of_service(kube) if n != "n1")
    # The others proceed afterwards, still one at a time.
    for _ in range(6):
        for agent in others:
            await agent.tick()
        for n in ("n2", "n3"):
            if machines[n].rebooter.calls:
                await (await machines[n].boot()).tick()
    spans = out_of_service(kube)
    assert {n for _, _, n in spans} == set(names), spans
    for (_, end, _n), (start, _, _m) in itertools.pairwise(spans):
        assert start >= end, spans  # never two nodes out of service


async def test_a_restart_with_the_same_boot_id_does_not_recover_as_if_rebooted(
    kube: KubeDouble, hosts: Callable[..., KubeHost]
) -> None:
    """The reboot command "succeeded" but the machine stayed up and only the agent restarted:
    the lock stays held, the node stays cordoned, and the reboot is tried again."""
    kube.add_node("n1")
    machine = hosts("n1", drain=FAST)
    machine.rebooter.happens = False
    machine.sentinel.touch()
    await (await machine.boot()).tick()
    assert machine.rebooter.calls == 1

    again = await machine.boot()  # same boot ID: the machine did not reboot
    assert again.rebooted_holding_lock is False
    assert again.state.last_reboot_at is None
    assert again.state.consecutive_reboots == 1
    assert again.view.failures_total["reboot"] == 1
    assert holder(kube) == "n1"
    assert kube.node("n1")["spec"]["unschedulable"] is True
    decision = await again.tick()
    assert decision.action is Action.REBOOT  # retried, with the lock it still holds
    assert machine.rebooter.calls == 2
    assert holder(kube) == "n1"

    machine.rebooter.happens = True  # now it reboots for real
    await (await machine.boot()).tick()
    assert machine.rebooter.calls == 3
    back = await machine.boot()
    assert back.rebooted_holding_lock is True
    assert (await back.tick()).why is Why.REBOOTED
    assert holder(kube) is None
    assert not kube.node("n1")["spec"].get("unschedulable")


def test_an_agent_killed_during_the_release_delay_still_honours_it(
    etcd: str, lock_key: str, tmp_path: Path
) -> None:
    """Real processes on a real etcd: n0 reboots, comes back, and is SIGKILLed while it sleeps
    the release delay; the restarted agent waits only what is left, and n1 does not reboot
    before n0 released."""
    events = tmp_path / "events.log"
    delay = 6.0
    hosts = [
        Host(
            tmp_path,
            n,
            etcd,
            events,
            *COMMON,
            "--lock-release-delay",
            f"{delay:.0f}s",
            lock_key=lock_key,
        )
        for n in ("n0", "n1")
    ]
    hosts[0].sentinel.touch()
    try:
        for h in hosts:
            h.start()

        def first_boot_after_reboot() -> float | None:
            history = read_events(events)
            reboots = [t for t, n, w in history if n == "n0" and w == "reboot"]
            boots = [t for t, n, w in history if n == "n0" and w == "boot" and reboots]
            later = [t for t in boots if t > reboots[0]] if reboots else []
            return later[0] if later else None

        assert wait_for(lambda: first_boot_after_reboot() is not None, 60), read_events(events)
        assert wait_for(lambda: "before releasing the lock" in hosts[0].log(), 30)
        came_back = first_boot_after_reboot()
        assert came_back is not None
        boots = hosts[0].boots
        proc = hosts[0].proc
        assert proc is not None
        os.kill(proc.pid, signal.SIGKILL)  # killed during recovery; the supervisor restarts it
        assert wait_for(lambda: hosts[0].boots > boots, 30)
        hosts[1].sentinel.touch()  # n1 now wants the lock too
        assert wait_for(lambda: released_at(hosts[0].log()), delay + 30), hosts[0].log()[-2000:]
        release = released_at(hosts[0].log())[0]
        assert release - came_back >= delay, (came_back, release)
        assert "of --lock-release-delay left" in hosts[0].log()
        assert wait_for(
            lambda: any(n == "n1" and w == "reboot" for _, n, w in read_events(events)), 60
        )
        n1_reboot = next(t for t, n, w in read_events(events) if n == "n1" and w == "reboot")
        assert n1_reboot > release
        print(f"release delay {delay}s; released {release - came_back:.2f}s after coming back")
    finally:
        for h in hosts:
            h.stop()


HOUR = 3600.0


def blocking_reason(agent: Agent) -> str:
    metrics = exposition(registry_for(AgentCollector(agent))).decode()
    found = re.findall(r'kured_blocking_reason\{node="[^"]+",reason="([a-z_]+)"\} 1\.0', metrics)
    assert len(found) == 1, found
    return found[0]


async def test_a_negated_sentinel_whose_tool_is_missing_reboots_once_a_day_not_every_hour(
    kube: KubeDouble, hosts: Callable[..., KubeHost]
) -> None:
    """B39 (kured #976): ``sh -c "! needs-restarting --reboothint"`` on a node without the
    tool exits 0 ("not found", negated), so a reboot is "required" after every boot. The first
    check after the reboot the agent caused still says so: no new attempt for
    ``--min-reboot-interval``, counted and shown. Hourly checks on virtual time."""
    kube.add_node("n1")
    clock = ManualClock(now_ms=int(time.time() * 1000))
    machine = hosts(
        "n1",
        drain=FAST,
        sentinel_command=("sh", "-c", "! kured-test-no-such-tool --reboothint"),
        min_reboot_interval_seconds=24 * HOUR,
        clock=clock,
    )
    first = await machine.boot()
    assert (await first.tick()).action is Action.REBOOT
    assert machine.rebooter.calls == 1

    back = await machine.boot()  # a new boot ID: the reboot happened, the "tool" is still missing
    assert (await back.tick()).why is Why.REBOOTED  # the lock is given back
    reasons = []
    for _ in range(23):  # the rest of the day, one check an hour
        clock.advance(HOUR)
        reasons.append((await back.tick()).why)
    assert machine.rebooter.calls == 1, reasons  # main: a reboot at every check
    assert set(reasons) == {Why.MIN_REBOOT_INTERVAL}
    assert blocking_reason(back) == "min_reboot_interval"
    assert back.view.failures_total["reboot_loop"] == 1
    blocked_by = str(status_of(back, "always")["blocked_by"])
    assert "--min-reboot-interval" in blocked_by
    observation = back.view.observation
    assert observation is not None
    assert "not found" in observation.sentinel_detail  # the shell's complaint is shown
    assert holder(kube) is None
    assert not kube.node("n1")["spec"].get("unschedulable")

    clock.advance(HOUR + 1)  # a day later it tries again (and the breaker bounds the attempts)
    assert (await back.tick()).action is Action.REBOOT
    assert machine.rebooter.calls == 2


async def test_a_sentinel_command_that_cannot_run_is_an_error_and_takes_no_lock(
    kube: KubeDouble, hosts: Callable[..., KubeHost]
) -> None:
    """B39 (1): exit 127 ("command not found") or 126 is an error, not "reboot required"."""
    kube.add_node("n1")
    for status in (127, 126):
        machine = hosts("n1", drain=FAST, sentinel_command=("sh", "-c", f"exit {status}"))
        agent = await machine.boot()
        decision = await agent.tick()
        assert decision.why is Why.SENTINEL_UNKNOWN, decision
        assert f"exited {status}" in decision.first
        assert agent.view.failures_total == {"sentinel": 1}
        assert machine.rebooter.calls == 0
        assert kube.annotation(NS, DS, KEY) is None  # no lock taken
        assert not kube.node("n1")["spec"].get("unschedulable")


async def test_a_failing_reboot_command_drains_the_node_once_not_every_period(
    kube: KubeDouble, hosts: Callable[..., KubeHost]
) -> None:
    """B40 (kured #17, #44; taken to be "the node is drained every period and never
    rebooted"): the reboot command fails, the node is uncordoned and the lock released at
    once, and there is no new cordon, drain or reboot for ``--min-reboot-interval``."""
    kube.add_node("n1")
    kube.add_pod("web", "web-abc", "n1", labels={"app": "web"}, owner=("ReplicaSet", "web"))
    clock = ManualClock(now_ms=int(time.time() * 1000))
    machine = hosts("n1", drain=FAST, min_reboot_interval_seconds=24 * HOUR, clock=clock)
    machine.rebooter.error = "exit status 1: Failed to connect to bus"
    machine.sentinel.touch()
    agent = await machine.boot()
    reasons = []
    for _ in range(12):  # twelve hourly checks
        reasons.append((await agent.tick()).why)
        clock.advance(HOUR)
    cordons = [at for at, node, cordoned in kube.schedulable_history if node == "n1" and cordoned]
    assert machine.rebooter.calls == 1, reasons  # main: 12
    assert len(cordons) == 1  # main: drained 12 times
    assert set(reasons[1:]) == {Why.MIN_REBOOT_INTERVAL}
    assert agent.view.failures_total == {"reboot": 1, "reboot_loop": 1}
    assert agent.state.consecutive_reboots == 1
    assert holder(kube) is None
    assert not kube.node("n1")["spec"].get("unschedulable")
