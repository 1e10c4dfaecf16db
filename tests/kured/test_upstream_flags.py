"""kured's flags ``--drain-pod-selector``, ``--drain-delay``, ``--reboot-delay`` and
``--prefer-no-schedule-taint`` (issue 15, deliver 3): in-process agents against the Kubernetes
API double (tests/kured/k8s_double.py, a documented double), the parser, and ``--help``."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Callable

import pytest

from kit.settings import SettingsError
from kured.actuators.drain import DrainOptions
from kured.actuators.node import NodeOptions
from kured.core.policy import Action
from kured.settings import add_arguments, load_settings
from tests.kured.conftest import LOCK_ANNOTATION, LOCK_DAEMONSET, LOCK_NAMESPACE
from tests.kured.k8s_double import KubeDouble
from tests.kured.kube_agent import KubeHost

NS, DS, KEY = LOCK_NAMESPACE, LOCK_DAEMONSET, LOCK_ANNOTATION
TAINT = "kured.dev/kured-node-reboot"
NEW_FLAGS = (
    "--drain-pod-selector",
    "--drain-delay",
    "--reboot-delay",
    "--prefer-no-schedule-taint",
)


def taints(kube: KubeDouble, node: str) -> list[dict[str, str]]:
    return list(kube.node(node)["spec"].get("taints") or [])


async def test_the_drain_pod_selector_evicts_only_matching_pods(
    kube: KubeDouble, hosts: Callable[..., KubeHost]
) -> None:
    for node in ("n1", "n2"):
        kube.add_node(node)
    kube.add_pod("web", "web-a", "n1", labels={"app": "web"}, owner=("ReplicaSet", "web"))
    kube.add_pod(
        "longhorn-system",
        "instance-manager-n1",
        "n1",
        labels={"longhorn.io/component": "instance-manager"},
    )
    host = hosts(
        "n1",
        drain=DrainOptions(
            timeout_seconds=20,
            poll_interval_seconds=0.05,
            pod_selector="longhorn.io/component!=instance-manager",
        ),
    )
    host.sentinel.touch()
    await (await host.boot()).tick()
    assert host.rebooter.calls == 1
    assert [(e.namespace, e.name) for e in kube.evictions] == [("web", "web-a")]
    assert kube.pod("longhorn-system", "instance-manager-n1") is not None
    listed = [r for r in kube.requests if r.method == "GET" and r.path == "/api/v1/pods"]
    assert any("labelSelector=longhorn.io" in r.query for r in listed), listed


async def test_drain_delay_and_reboot_delay_are_waited_in_their_places(
    kube: KubeDouble, hosts: Callable[..., KubeHost]
) -> None:
    kube.add_node("n1")
    host = hosts(
        "n1",
        drain=DrainOptions(timeout_seconds=20, poll_interval_seconds=0.05),
        drain_delay_seconds=0.6,
        reboot_delay_seconds=0.8,
    )
    host.sentinel.touch()
    await (await host.boot()).tick()
    assert host.rebooter.calls == 1
    lock_put = min(r.at for r in kube.requests if r.method == "PUT" and "daemonsets" in r.path)
    cordoned = min(at for at, node, on in kube.schedulable_history if node == "n1" and on)
    pod_list = max(r.at for r in kube.requests if r.path == "/api/v1/pods")
    assert cordoned - lock_put >= 0.6, (lock_put, cordoned)  # --drain-delay before the cordon
    assert host.rebooter.at[0] - pod_list >= 0.8, (pod_list, host.rebooter.at)  # after the drain


async def test_the_prefer_no_schedule_taint_is_on_while_waiting_for_the_lock_only(
    kube: KubeDouble, hosts: Callable[..., KubeHost]
) -> None:
    other = {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}
    kube.add_node("n1", taints=[other])
    kube.add_node("n2")
    kube.set_annotation(
        NS,
        DS,
        KEY,
        '{"nodeID":"n2","metadata":{"unschedulable":false},"created":"2026-03-01T08:12:44Z","TTL":0}',
    )
    host = hosts("n1", node_options=NodeOptions(prefer_no_schedule_taint=TAINT))
    host.sentinel.touch()
    agent = await host.boot()
    decision = await agent.tick()
    assert decision.action is Action.ACQUIRE  # waiting: n2 holds the lock
    assert taints(kube, "n1") == [other, {"key": TAINT, "effect": "PreferNoSchedule"}]
    writes = kube.count("PATCH", "/nodes/n1$")
    await agent.tick()
    assert kube.count("PATCH", "/nodes/n1$") == writes  # set once, not every period
    host.sentinel.unlink()  # no reboot needed any more
    await agent.tick()
    assert taints(kube, "n1") == [other]
    assert not kube.node("n1")["spec"].get("unschedulable")


def parse(*flags: str) -> object:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return load_settings(parser.parse_args(["--node-id", "n", *flags]), {})


def test_the_new_flags_parse_and_need_the_kubernetes_backend() -> None:
    s = parse(
        "--lock-backend=kubernetes",
        "--drain-delay=90s",
        "--reboot-delay=1m",
        "--drain-pod-selector=app!=longhorn",
        f"--prefer-no-schedule-taint={TAINT}",
    )
    assert (s.drain_delay, s.reboot_delay) == (90.0, 60.0)  # type: ignore[attr-defined]
    assert s.drain_pod_selector == "app!=longhorn"  # type: ignore[attr-defined]
    assert s.prefer_no_schedule_taint == TAINT  # type: ignore[attr-defined]
    assert parse("--reboot-delay=5s").reboot_delay == 5.0  # type: ignore[attr-defined]  # any backend
    with pytest.raises(SettingsError) as raised:
        parse("--drain-delay=1s", "--drain-pod-selector=a=b", f"--prefer-no-schedule-taint={TAINT}")
    (problem,) = raised.value.problems
    for flag in ("--drain-delay", "--drain-pod-selector", "--prefer-no-schedule-taint"):
        assert flag in problem
    with pytest.raises(SettingsError) as raised:
        parse(
            "--lock-backend=kubernetes",
            "--prefer-no-schedule-taint=not a key",
            "--reboot-delay=-1s",
        )
    assert len(raised.value.problems) == 2
    assert any("not a valid taint key" in p for p in raised.value.problems)


def test_help_lists_the_new_flags() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "kured.cli", "--help"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    ).stdout
    for flag in NEW_FLAGS:
        assert flag in out, flag
    assert "KURED_PREFER_NO_SCHEDULE_TAINT" in out
