"""``kura_harness.rolling.evaluate``: the invariant checker of the rolling-reboot scenario flags each
kind of violation in recorded data (the e2e test only shows it passes a good run)."""

from __future__ import annotations

import copy

import pytest

from kura_harness.rolling import (
    ClientRun,
    HostReport,
    RollingResult,
    evaluate,
    log_times,
    percentile,
)

MiB = 1024 * 1024


def good() -> RollingResult:
    """Three hosts rebooted at 10, 20, 30; each ready 5 s later; lock [t-0.1, t+4]."""
    hosts = []
    history = []
    for i, t in enumerate((10.0, 20.0, 30.0)):
        hosts.append(
            HostReport(
                f"host{i}",
                i,
                "SIGKILL" if i == 0 else "SIGTERM",
                i > 0,
                reboot_at=t,
                kura_up_at=t + 1,
                ready_at=t + 5,
                reboots=1,
                tmp_budget_bytes=16 * MiB,
                tmp_peak_bootstrap_bytes=5 * MiB,
                tmp_peak_during_any_bootstrap={"host0": MiB, "host1": 5 * MiB, "host2": MiB},
                tmp_peak_run_bytes=6 * MiB,
            )
        )
        history.append({"host": f"host{i}", "acquired": t - 0.1, "released": t + 4})
    clients = [
        ClientRun(phase, c, "host0", 0, 1, 0, True, True, phase == "during")
        for phase in ("before", "during", "after")
        for c in ("nx", "turbo", "ccache")
    ]
    res = RollingResult(
        hosts=hosts,
        lock_history=history,
        clients=clients,
        artifacts_total=10,
        verified_reads=30,
        prometheus={"rules_loaded_ok": True},
        finished=True,
    )
    return res


def test_a_good_run_has_no_violations() -> None:
    assert evaluate(good()) == []


def violations_after(change) -> list[str]:  # type: ignore[no-untyped-def]
    res = copy.deepcopy(good())
    change(res)
    return evaluate(res)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda r: setattr(r.hosts[2], "reboot_at", None), "host2 was never rebooted"),
        (lambda r: setattr(r.hosts[1], "reboots", 2), "host1 was rebooted 2 times"),
        (lambda r: r.lock_history[1].update(acquired=13.0), "lock overlap"),
        (
            lambda r: setattr(r.hosts[0], "last_not_ready_at", 20.2),
            "host1 rebooted at 20.000 before host0",
        ),
        (
            lambda r: setattr(r.hosts[0], "kura_up_at", 20.5),
            "host1 rebooted at 20.000 before host0",
        ),
        (lambda r: setattr(r.hosts[1], "reboot_at", 25.0), "outside its lock"),
        (lambda r: r.lost.append("nx 1 on host1: 404"), "artifact copies lost"),
        (lambda r: setattr(r, "verified_reads", 29), "verified 29 of 30"),
        (lambda r: setattr(r.load, "read_failures_on_up_nodes", 1), "reads failed on nodes"),
        (
            lambda r: r.hosts[1].tmp_peak_during_any_bootstrap.update(host2=17 * MiB),
            "host2's tmp reached",
        ),
        (lambda r: setattr(r.clients[6], "hit", False), "nx: no REMOTE HIT after the run"),
        (
            lambda r: [setattr(c, "overlapped_reboot", False) for c in r.clients],
            "no real client build ran while a host was rebooting",
        ),
        (lambda r: setattr(r.clients[4], "hit", False), "turbo against host0 (up throughout)"),
        (lambda r: setattr(r, "finished", False), "did not finish"),
        (lambda r: r.prometheus.update(rules_loaded_ok=False), "prometheus did not load"),
    ],
)
def test_each_violation_is_named(change, expected: str) -> None:  # type: ignore[no-untyped-def]
    found = violations_after(change)
    assert any(expected in v for v in found), found


def test_a_client_run_cut_by_its_nodes_reboot_is_excused() -> None:
    def cut(r: RollingResult) -> None:
        r.clients[4].hit = False
        r.clients[4].target_stayed_up = False

    assert violations_after(cut) == []


def test_skipped_clients_are_not_required() -> None:
    def skip(r: RollingResult) -> None:
        r.clients = []
        r.clients_skipped = "missing tools"

    assert violations_after(skip) == []


def test_log_times_and_percentile() -> None:
    log = (
        "2026-01-02T03:04:05.678 INFO kured.loop lock acquired by host1\n"
        "2026-01-02T03:04:09.000 INFO kured.loop lock released by host1\n"
    )
    (acquired,) = log_times(log, "lock acquired by host1")
    (released,) = log_times(log, "lock released by host1")
    assert released - acquired == pytest.approx(3.322, abs=1e-6)
    assert percentile([], 99) is None
    assert percentile([float(i) for i in range(1, 101)], 99) == 99.0
    assert percentile([5.0], 50) == 5.0


def test_a_reboot_between_the_last_refusal_and_the_first_200_is_not_a_violation() -> None:
    """The observer knows the previous node's switch to ready only to within one poll: after
    its last refused ``/ready`` and at or before its first 200. A reboot in between cannot be
    told from a correct one (kured's own probe may have seen the 200 first), so it is not
    named; one before the last refusal is (``test_each_violation_is_named``)."""
    res = copy.deepcopy(good())
    res.hosts[0].last_not_ready_at = 19.9
    res.hosts[0].ready_at = 20.1  # host1 rebooted at 20.0, inside (19.9, 20.1]
    assert evaluate(res) == []
