"""After the run: turn the agents' logs, the events file, the load's operations and Prometheus's
history into the ``RollingResult``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import time
from typing import TYPE_CHECKING, Any

from kura_harness.rolling.invariants import evaluate
from kura_harness.rolling.observe import log_times, read_events

if TYPE_CHECKING:
    from kura_harness.rolling.scenario import Rolling


def collect(demo: Rolling) -> None:
    """Fill ``demo.result`` after the run: host reports, lock history and hand-offs from the
    agents' logs, reboot times from the events file, latencies, client overlaps, the alerts
    Prometheus saw, and the verdict (``evaluate`` plus what was observed live)."""
    res = demo.result
    res.hosts = [h.report for h in demo.hosts]
    res.tmp_samples = demo.sampler.samples
    for h in demo.hosts:
        h.report.tmp_peak_run_bytes = demo.sampler.peaks[h.name]
    history = []
    for h in demo.hosts:
        log = h.agent_log()
        acquired = log_times(log, f"lock acquired by {h.name}")
        released = log_times(log, f"lock released by {h.name}")
        rebooting = log_times(log, f"rebooting node {h.name}")
        for a in acquired:
            rel = min((t for t in released if t >= a), default=None)
            reb = min((t for t in rebooting if t >= a), default=None)
            history.append({"host": h.name, "acquired": a, "rebooting": reb, "released": rel})
        if acquired:
            h.report.lock_acquired_at = acquired[0]
            h.report.lock_released_at = min((t for t in released if t >= acquired[0]), default=None)
    res.lock_history = sorted(history, key=lambda e: float(e["acquired"]))
    for t, host, what in read_events(demo.events):
        if what == "reboot":
            for h in demo.hosts:
                if h.name == host and h.report.reboot_at is None:
                    h.report.reboot_at = t
    ordered = sorted(
        (h.report for h in demo.hosts if h.report.reboot_at is not None),
        key=lambda r: r.reboot_at or 0.0,
    )
    for prev, nxt in itertools.pairwise(ordered):
        freed, ready = prev.lock_released_at, prev.ready_at
        handoff: dict[str, Any] = {
            "from": prev.name,
            "to": nxt.name,
            "from_lock_released": freed,
            "from_ready": ready,
            "to_lock_acquired": nxt.lock_acquired_at,
            "to_reboot": nxt.reboot_at,
        }
        if freed is not None and nxt.lock_acquired_at is not None:
            handoff["lock_free_seconds"] = nxt.lock_acquired_at - freed
        if freed is not None and ready is not None:
            # > 0: the lock was free but the gate (this node's /ready) still held the next
            # reboot back for this long.
            handoff["ready_after_release_seconds"] = ready - freed
        if ready is not None and nxt.reboot_at is not None:
            handoff["reboot_after_ready_seconds"] = nxt.reboot_at - ready
        res.handoffs.append(handoff)
    windows = demo.reboot_windows()
    demo.load.latencies(windows)
    # Every timed request and the windows, for a breakdown the summary does not make.
    with (demo.workdir / "ops.json").open("w") as f:
        ops = [dataclasses.asdict(op) for op in demo.load.ops]
        json.dump({"windows": windows, "ops": ops}, f)
    res.load = demo.load.report
    if demo.clients is not None:
        for c in demo.clients.runs:
            c.overlapped_reboot = any(c.started_at < e and c.ended_at > s for s, e, _ in windows)
        res.clients = demo.clients.runs
    with contextlib.suppress(OSError, ValueError, KeyError):
        span = max(60, int(time.time() - res.started_at) + 5)
        seen = demo.prometheus.query(f"max_over_time(ALERTS[{span}s])")
        res.prometheus["alerts_seen"] = sorted(
            {f"{s['metric']['alertname']} ({s['metric'].get('alertstate', '')})" for s in seen}
        )
        # Which agents Prometheus saw held back by a closed or unreachable gate.
        gated = demo.prometheus.query(
            f'max by (node, reason) (max_over_time(kured_blocking_reason{{reason=~"gate_.*"}}[{span}s])) == 1'
        )
        res.prometheus["agents_gate_blocked"] = sorted(
            f"{s['metric'].get('node', '')} ({s['metric'].get('reason', '')})" for s in gated
        )
    res.ended_at = time.time()
    observed = res.violations + demo.load.report.violations
    res.violations = evaluate(res) + observed
    res.ok = not res.violations
