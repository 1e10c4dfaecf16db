"""Field report B36: a reboot lock whose holder still exists but is NotReady (kured #137, #847).

In-process agents against the Kubernetes API double (tests/kured/k8s_double.py: no API server
runs here), on virtual time (``kit.clock.ManualClock`` drives the agent and the lock):

* with a TTL on the holder's record, another node takes the lock once the TTL has passed, Ready
  or not (kured's rule, kept: expiry by each record's own TTL);
* with TTL 0 (kured's default) the lock is never taken over while the holder's Node exists,
  on purpose (docs/kured.md "Lock TTL"), but the waiting node says so at every check, with the
  holder's age, and ``kured_lock_held_seconds{holder}`` gives the number to alert on;
* with ``--concurrency`` > 1 each entry expires by its own TTL.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable

import pytest

from kit.clock import ManualClock
from kured.core import lockrecord
from kured.core.policy import Action, Why
from kured.metrics import AgentCollector, exposition, registry_for
from tests.kured.conftest import LOCK_ANNOTATION, LOCK_DAEMONSET, LOCK_NAMESPACE
from tests.kured.k8s_double import KubeDouble
from tests.kured.kube_agent import KubeHost

NS, DS, KEY = LOCK_NAMESPACE, LOCK_DAEMONSET, LOCK_ANNOTATION
HOUR = 3600.0
NS_PER_S = 1_000_000_000


def entry(
    node: str, clock: ManualClock, age_seconds: float, ttl_seconds: float
) -> dict[str, object]:
    """kured's lock record for ``node``, taken ``age_seconds`` before the clock's now."""
    created_ns = clock.now_ms() * 1_000_000 - int(age_seconds * NS_PER_S)
    return {
        "nodeID": node,
        "metadata": {"unschedulable": False},
        "created": lockrecord.format_created(created_ns),
        "TTL": int(ttl_seconds * NS_PER_S),
    }


def held_seconds(host: KubeHost, agent: object, holder: str) -> float | None:
    metrics = exposition(registry_for(AgentCollector(agent))).decode()  # type: ignore[arg-type]
    m = re.search(
        rf'kured_lock_held_seconds\{{holder="{holder}",node="{host.node_id}"\}} ([0-9.e+]+)',
        metrics,
    )
    return float(m.group(1)) if m else None


def waiting_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and "waiting for the reboot lock" in r.getMessage()
    ]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(now_ms=int(time.time() * 1000))


async def test_a_notready_holder_keeps_a_ttl0_lock_and_its_age_is_shown_at_every_check(
    kube: KubeDouble,
    hosts: Callable[..., KubeHost],
    clock: ManualClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    kube.add_node("a", ready=False)  # up as an object, its kubelet silent
    kube.add_node("b")
    kube.set_annotation(NS, DS, KEY, json.dumps(entry("a", clock, 2 * HOUR, ttl_seconds=0)))
    machine = hosts("b", clock=clock)
    machine.sentinel.touch()
    agent = await machine.boot()
    caplog.set_level(logging.WARNING, logger="kured.loop")

    reasons = []
    for _ in range(3):  # three hourly checks
        reasons.append((await agent.tick()).why)
        clock.advance(HOUR)
    clock.advance(-HOUR)  # back to the last check's instant

    assert reasons == [Why.LOCK_HELD_ELSEWHERE] * 3
    assert machine.rebooter.calls == 0  # no takeover: TTL 0 never expires (kured's rule)
    assert json.loads(kube.annotation(NS, DS, KEY) or "{}")["nodeID"] == "a"
    lines = waiting_lines(caplog)
    assert len(lines) == 3, lines  # once per check, not once per change
    assert "held by a for 14400s" in lines[-1], lines  # 2 h before the first check, + 2 h
    assert "never expires" in lines[-1]
    assert held_seconds(machine, agent, "a") == pytest.approx(4 * HOUR, abs=1)


async def test_a_notready_holder_with_a_ttl_loses_the_lock_once_the_ttl_has_passed(
    kube: KubeDouble,
    hosts: Callable[..., KubeHost],
    clock: ManualClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    kube.add_node("a", ready=False)
    kube.add_node("b")
    kube.set_annotation(NS, DS, KEY, json.dumps(entry("a", clock, 0, ttl_seconds=HOUR)))
    machine = hosts("b", clock=clock)
    machine.sentinel.touch()
    agent = await machine.boot()
    caplog.set_level(logging.WARNING, logger="kured.loop")

    assert (await agent.tick()).why is Why.LOCK_HELD_ELSEWHERE
    clock.advance(HOUR - 60)
    assert (await agent.tick()).why is Why.LOCK_HELD_ELSEWHERE
    assert "expires in 60s" in waiting_lines(caplog)[-1]
    assert machine.rebooter.calls == 0
    clock.advance(60)  # the TTL has passed: a's record is expired, Ready or not
    assert (await agent.tick()).action is Action.REBOOT
    assert machine.rebooter.calls == 1
    assert json.loads(kube.annotation(NS, DS, KEY) or "{}")["nodeID"] == "b"


async def test_with_concurrency_each_holder_entry_expires_by_its_own_ttl(
    kube: KubeDouble, hosts: Callable[..., KubeHost], clock: ManualClock
) -> None:
    for node in ("a", "b", "c"):
        kube.add_node(node, ready=node != "a")
    record = {
        "maxOwners": 2,
        "locks": [
            entry("a", clock, 2 * HOUR, ttl_seconds=HOUR),  # expired an hour ago
            entry("c", clock, 2 * HOUR, ttl_seconds=0),  # never expires
        ],
    }
    kube.set_annotation(NS, DS, KEY, json.dumps(record))
    machine = hosts("b", clock=clock, concurrency=2)
    machine.sentinel.touch()
    agent = await machine.boot()

    assert (await agent.tick()).action is Action.REBOOT  # a's slot, not c's
    stored = json.loads(kube.annotation(NS, DS, KEY) or "{}")
    assert [e["nodeID"] for e in stored["locks"]] == ["c", "b"]
