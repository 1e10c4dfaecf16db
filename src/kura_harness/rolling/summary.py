"""The terminal summary of a run."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from kura_harness.rolling.config import MiB, RollingResult

if TYPE_CHECKING:
    from kura_harness.rolling.scenario import Rolling


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f} ms"


def render_summary(res: RollingResult) -> str:
    t0 = res.rolling_started_at or res.started_at

    def rel(t: float | None) -> str:
        return "-" if t is None else f"+{t - t0:.1f}s"

    lines = ["", "phase            seconds"]
    for name, p in res.phases.items():
        lines.append(f"  {name:<15}{p['seconds']:7.1f}")
    lines.append("")
    header = (
        f"{'host':<6} {'stop':<8} {'wiped':<6} {'reboot':>8} {'ready':>8} {'boot→ready':>10} "
        f"{'refill':>10} {'MiB/s':>7}  tmp on disk / reserved / budget"
    )
    lines.append(header)
    for h in sorted(res.hosts, key=lambda h: h.reboot_at or float("inf")):
        boot = "-" if h.bootstrap_seconds is None else f"{h.bootstrap_seconds:.1f}s"
        rate = "-" if h.bootstrap_mib_per_second is None else f"{h.bootstrap_mib_per_second:.1f}"
        tmp = (
            f"{h.tmp_peak_bootstrap_bytes / MiB:.1f} / {h.tmp_reserved_peak_bytes / MiB:.1f} / "
            f"{h.tmp_budget_bytes / MiB:.0f} MiB"
        )
        lines.append(
            f"{h.name:<6} {h.stop_signal:<8} {'yes' if h.wiped else 'no':<6} "
            f"{rel(h.reboot_at):>8} {rel(h.ready_at):>8} {boot:>10} "
            f"{h.refill_bytes / MiB:>6.1f} MiB {rate:>7}  {tmp}"
        )
    lines.append("")
    lines.append("lock history (kured agent logs):")
    for e in res.lock_history:
        lines.append(
            f"  {e['host']:<6} acquired {rel(e['acquired'])}  released {rel(e['released'])}"
        )
    for hand in res.handoffs:
        after = hand.get("reboot_after_ready_seconds")
        held = hand.get("ready_after_release_seconds")
        text = f"  {hand['from']} -> {hand['to']}: next reboot "
        text += "-" if after is None else f"{after:.2f}s after {hand['from']} was ready again"
        if held is not None and held > 0:
            text += f"; the gate kept the free lock for {held:.1f}s until then"
        lines.append(text)
    ld = res.load
    lines += [
        "",
        f"load: seeded {ld.seeded_artifacts} artifacts ({ld.seeded_bytes / MiB:.1f} MiB); during the run "
        f"{ld.run_writes_acked} writes acknowledged ({ld.run_written_bytes / MiB:.1f} MiB), "
        f"{ld.reads} reads, {ld.ops_per_second:.0f} ops/s",
        f"  failures on up nodes: reads {ld.read_failures_on_up_nodes}, writes "
        f"{ld.write_errors_on_up_nodes}; shed 503 {ld.writes_shed_503}; replication-lag misses "
        f"{ld.read_lag_misses}; cut by a reboot (excused) {ld.reads_excused + ld.writes_excused}",
        f"  read latency during reboots: p50 {_ms(ld.read_p50_ms_during)}, p99 "
        f"{_ms(ld.read_p99_ms_during)} (n={ld.reads_during_reboot}; of these, served by the "
        f"rebooting node while it booted: p99 {_ms(ld.read_p99_ms_joining_node)}, "
        f"n={ld.reads_on_joining_node}; by the other nodes: p99 "
        f"{_ms(ld.read_p99_ms_during_other_nodes)}, n={ld.reads_during_on_other_nodes})",
        f"  read latency outside reboots: p50 {_ms(ld.read_p50_ms_outside)}, p99 "
        f"{_ms(ld.read_p99_ms_outside)} (n={ld.reads_outside_reboot})",
        f"lost artifacts: {len(res.lost)} of {res.artifacts_total} (each read from every node: "
        f"{res.verified_reads} reads)",
    ]
    if res.clients_skipped:
        lines.append(f"real clients: skipped ({res.clients_skipped})")
    else:
        by_phase: dict[str, list[str]] = {}
        for c in res.clients:
            mark = "HIT" if c.hit else f"MISS(rc={c.returncode})"
            flag = "*" if c.overlapped_reboot else ""
            by_phase.setdefault(c.phase, []).append(f"{c.client}@{c.host} {mark}{flag}")
        lines.append("real clients (* = while a host was rebooting):")
        for phase in ("before", "during", "after"):
            lines.append(f"  {phase:<7} " + ", ".join(by_phase.get(phase, [])))
    prom = res.prometheus
    if prom:
        rules = prom.get("rules", [])
        lines.append(
            f"prometheus: {len(rules)} rules loaded ({'ok' if prom.get('rules_loaded_ok') else 'NOT ok'}); "
            f"alerts seen: {', '.join(prom.get('alerts_seen', [])) or 'none'}"
        )
        lines.append(
            "  agents held back by a gate at some point: "
            + (", ".join(prom.get("agents_gate_blocked", [])) or "none")
        )
    lines.append("")
    if res.ok:
        lines.append("result: OK — every invariant held")
    else:
        lines.append(f"result: FAILED — {len(res.violations)} violations:")
        lines += [f"  - {v}" for v in res.violations[:30]]
    lines.append(f"summary: {res.summary_path}")
    return "\n".join(lines)


def progress_line(demo: Rolling) -> str:
    """The one-line state of every host and of the load, printed every 2 s while rolling."""
    t = time.time() - demo.result.rolling_started_at
    parts = [f"rolling +{t:5.1f}s"]
    for h in demo.hosts:
        rep = h.report
        if h.rebooting or (rep.requested_at and rep.kura_up_at is None):
            state = "REBOOTING"
        elif rep.kura_up_at and rep.ready_at is None:
            state = f"booting ({h.bootstrap_line or 'starting'})"
        elif rep.ready_at:
            state = "rebooted"
        else:
            state = "waiting"
        parts.append(f"{h.name} {state}")
    writes, reads = demo.load.ops_in_last(2.0)
    r = demo.load.report
    parts.append(f"load {(writes + reads) / 2:.0f} ops/s")
    parts.append(
        f"errors {r.read_failures_on_up_nodes + r.write_errors_on_up_nodes}"
        f" (excused {r.reads_excused + r.writes_excused})"
    )
    return " | ".join(parts)
