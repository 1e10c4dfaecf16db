"""The whole system: kured reboots every host of a live 3-node kura mesh, one at a time, while
a load generator and real Nx, Turborepo and ccache builds use the cache (issue "a rolling reboot
of a live cache mesh loses nothing and never leaves clients without a cache").

The scenario is ``kura_harness.rolling`` (the same code as ``kura demo rolling-reboot``) at CI size:
about 40 MB of artifacts, a 16 MiB tmp budget per node, host0 SIGKILLed, hosts 1 and 2 SIGTERMed
with their data dirs wiped. Real processes throughout: 3 ``kura serve``, 3 ``kured`` agents, one
etcd (the lock), one Prometheus loading deploy/alerts/*.rules.yml.

Every must-show invariant is asserted here from the recorded data: the reboot events the
agents' reboot command wrote, the "lock acquired/released" lines of the agents' own logs, the
demo's per-host /ready timestamps, the external tmp sampler's peaks, the load generator's
read outcomes, the end-of-run verification of every acknowledged artifact on every node, and
the real clients' output. The real clients are required: missing tools fail the test (run
scripts/install-deps), they never skip it.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from kura_harness import rolling
from tests.kured.agents import read_events, released_at

HOSTS = ("host0", "host1", "host2")
pytestmark = pytest.mark.timeout(480)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> rolling.RollingResult:
    workdir = tmp_path_factory.mktemp("rolling")
    config = rolling.RollingConfig(
        workdir=workdir,
        hosts=3,
        data_mb=40,
        clients="require",
        rolling_timeout_seconds=240,
        keep=True,
        progress=print,
    )
    result = rolling.run(config)
    print(rolling.render_summary(result))
    return result


def workdir(run: rolling.RollingResult) -> Path:
    return Path(run.workdir)


def lock_intervals(run: rolling.RollingResult) -> list[tuple[float, float, str]]:
    """(acquired, released, host) from each agent's own log, sorted."""
    out = []
    for host in HOSTS:
        log = (workdir(run) / host / "kured.log").read_text()
        acquired = rolling.log_times(log, f"lock acquired by {host}")
        released = released_at(log)
        for a in acquired:
            r = min((t for t in released if t >= a), default=None)
            assert r is not None, f"{host} took the lock at {a} and never gave it back"
            out.append((a, r, host))
    return sorted(out)


def test_the_run_held_every_invariant(run: rolling.RollingResult) -> None:
    assert run.finished, rolling.render_summary(run)
    assert run.ok, rolling.render_summary(run)
    assert rolling.evaluate(run) == []
    summary = json.loads(Path(run.summary_path).read_text())
    assert summary["ok"] is True


def test_every_host_rebooted_once_strictly_one_at_a_time(run: rolling.RollingResult) -> None:
    events = read_events(workdir(run) / "events.log")
    reboots = [(t, host) for t, host, what in events if what == "reboot"]
    assert sorted(h for _, h in reboots) == list(HOSTS), events
    intervals = lock_intervals(run)
    assert [h for _, _, h in intervals] == [h for _, h in reboots], (intervals, reboots)
    for (_, released, prev), (acquired, _, nxt) in itertools.pairwise(intervals):
        assert acquired > released, f"{nxt} took the lock before {prev} gave it back"
    for (t, host), (acquired, released, holder) in zip(reboots, intervals, strict=True):
        assert holder == host, (reboots, intervals)
        assert acquired <= t + 0.002, (host, t, acquired)  # log times are truncated to ms
        assert t < released, (host, t, released)


def test_each_reboot_starts_only_after_the_previous_node_is_ready_again(
    run: rolling.RollingResult,
) -> None:
    by_name = {h.name: h for h in run.hosts}
    reboots = sorted(
        (t, host) for t, host, what in read_events(workdir(run) / "events.log") if what == "reboot"
    )
    for (_, prev), (t_next, nxt) in itertools.pairwise(reboots):
        ready = by_name[prev].ready_at
        assert ready is not None, f"{prev} never answered /ready 200 after its reboot"
        booted = by_name[prev].kura_up_at
        assert booted is not None
        assert ready > booted
        # After the last /ready refusal the observer saw (the switch lies between it and the
        # first 200, which one poll cannot pin down: ``invariants``).
        not_ready = by_name[prev].surely_not_ready_at()
        assert not_ready is not None
        assert t_next > not_ready, (
            f"{nxt} rebooted at {t_next} before {prev} was ready (refused /ready at {not_ready})"
        )
    # The /ready gate, not the lock-release delay, is what held the next reboot back: at least
    # once the lock was already free while the wiped node was still bootstrapping.
    held = [h for h in run.handoffs if h.get("ready_after_release_seconds", 0) > 0]
    assert held, run.handoffs
    assert any(by_name[h["from"]].wiped for h in held), run.handoffs


def test_nothing_acknowledged_is_lost_and_no_read_failed_on_an_up_node(
    run: rolling.RollingResult,
) -> None:
    load = run.load
    assert load.seeded_bytes >= 30 * 1000 * 1000
    assert {"http", "nx", "turbo", "keyvalue"} <= set(load.seeded_by_protocol)
    assert load.run_writes_acked > 0
    assert run.artifacts_total == load.seeded_artifacts + load.run_writes_acked
    assert run.lost == []
    assert run.verified_reads == run.artifacts_total * len(HOSTS)
    assert load.reads > 100
    assert load.reads_during_reboot > 0
    assert load.read_failures_on_up_nodes == 0, load.violations
    assert load.write_errors_on_up_nodes == 0, load.violations
    assert load.read_p99_ms_during is not None
    assert load.read_p99_ms_outside is not None


def test_wiped_nodes_bootstrapped_within_their_tmp_budget(run: rolling.RollingResult) -> None:
    assert run.tmp_samples > 1000  # the external sampler really ran
    wiped = [h for h in run.hosts if h.wiped]
    assert [h.name for h in wiped] == ["host1", "host2"]
    for h in wiped:
        assert h.refill_bytes >= run.load.seeded_bytes, h  # it refilled everything seeded
        assert h.bootstrap_applied_artifacts > 0
    for h in run.hosts:
        assert h.tmp_peak_during_any_bootstrap, h
        for node, peak in h.tmp_peak_during_any_bootstrap.items():
            assert peak <= h.tmp_budget_bytes, f"{node} tmp {peak} > budget while {h.name} booted"
        assert h.tmp_peak_run_bytes <= h.tmp_budget_bytes
    # Bootstrap used the budget (it is not trivially far below it): it staged bodies of the
    # largest class (1 MiB to max_artifact_bytes, 4 MiB) in tmp. One body per peer at a time
    # (module docstring of the demo's config): two large bodies overlap on some runs (5.0 MiB
    # seen) and not on others (3.75 MiB, one body caught near its end, on CI).
    assert max(h.tmp_peak_bootstrap_bytes for h in wiped) > 3 * rolling.MiB


def test_real_clients_hit_before_during_and_after(run: rolling.RollingResult) -> None:
    assert not run.clients_skipped
    for phase in ("before", "after"):
        for client in ("nx", "turbo", "ccache"):
            runs = [c for c in run.clients if c.phase == phase and c.client == client]
            assert runs, (phase, client)
            assert all(c.hit for c in runs), (phase, client, runs)
    during = [c for c in run.clients if c.phase == "during"]
    assert any(c.overlapped_reboot and c.hit for c in during), during
    for c in during:
        if c.target_stayed_up:
            assert c.hit, c


def test_prometheus_loaded_every_alert_rule(run: rolling.RollingResult) -> None:
    prom = run.prometheus
    assert prom["rules_loaded_ok"]
    names = {r["name"] for r in prom["rules"]}
    repo = Path(__file__).resolve().parents[2]
    for rules in (repo / "deploy" / "alerts").glob("*.rules.yml"):
        assert set(rolling.kura_alert_names(rules)) <= names
    kura = rolling.kura_alert_names(repo / "deploy" / "alerts" / "kura.rules.yml")
    assert prom["alert_filter_regexp"] == "^(" + "|".join(kura) + ")$"
    assert all(t["health"] == "up" for t in prom["targets"])
    assert len(prom["targets"]) == 6
