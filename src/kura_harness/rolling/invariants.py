"""The must-show invariants of a rolling reboot, checked on the recorded data alone (so a unit
test can feed it a doctored ``RollingResult``).
"""

from __future__ import annotations

import itertools

from kura_harness.rolling.config import CLIENT_NAMES, RollingResult


def evaluate(res: RollingResult) -> list[str]:
    """Every must-show invariant the recorded data violates (empty: all hold)."""
    out: list[str] = []
    hosts = res.hosts
    # All hosts rebooted, once each, strictly one at a time under the lock.
    for h in hosts:
        if h.reboot_at is None:
            out.append(f"{h.name} was never rebooted")
        elif h.reboots != 1:
            out.append(f"{h.name} was rebooted {h.reboots} times")
        if h.reboot_at is not None and h.ready_at is None:
            out.append(f"{h.name} never answered /ready 200 after its reboot")
    history = res.lock_history
    if len(history) != len(hosts):
        out.append(f"{len(history)} lock acquisitions for {len(hosts)} hosts: {history}")
    for prev, nxt in itertools.pairwise(history):
        if prev["released"] is None or nxt["acquired"] <= prev["released"]:
            out.append(
                f"lock overlap: {nxt['host']} acquired at {nxt['acquired']:.3f} before "
                f"{prev['host']} released ({prev['released']})"
            )
    by_name = {x.name: x for x in hosts}
    for entry in history:
        holder = by_name.get(entry["host"])
        if holder is None or holder.reboot_at is None:
            continue
        released = entry["released"]
        if not (
            entry["acquired"] <= holder.reboot_at + 0.002
            and (released is None or holder.reboot_at < released)
        ):
            out.append(f"{holder.name} rebooted at {holder.reboot_at:.3f} outside its lock {entry}")
    ordered = sorted((h for h in hosts if h.reboot_at is not None), key=lambda h: h.reboot_at or 0)
    # The observer polls /ready, so it knows the switch only to within one poll: it lies after
    # the last refusal and at or before the first 200. A reboot before that refusal is a
    # violation; one inside the interval cannot be told from a correct one (a CI run on a
    # loaded machine saw kured's gate pass 0.1 s before the observer's next poll).
    for prev_h, next_h in itertools.pairwise(ordered):
        assert next_h.reboot_at is not None
        not_ready = prev_h.surely_not_ready_at()
        if prev_h.ready_at is None or not_ready is None or next_h.reboot_at <= not_ready:
            out.append(
                f"{next_h.name} rebooted at {next_h.reboot_at:.3f} before {prev_h.name} was "
                f"ready again (it refused /ready at {not_ready}; first 200 at {prev_h.ready_at})"
            )
    # Nothing lost, no failed read on an up node.
    if res.lost:
        out.append(f"{len(res.lost)} artifact copies lost or wrong, e.g. {res.lost[:3]}")
    if res.artifacts_total and res.verified_reads != res.artifacts_total * len(hosts):
        out.append(f"verified {res.verified_reads} of {res.artifacts_total * len(hosts)} copies")
    if res.load.read_failures_on_up_nodes:
        out.append(f"{res.load.read_failures_on_up_nodes} reads failed on nodes that were up")
    if res.load.write_errors_on_up_nodes:
        out.append(f"{res.load.write_errors_on_up_nodes} writes failed on nodes that were up")
    # The tmp budget held during every bootstrap (and the whole run).
    for h in hosts:
        for name, peak in h.tmp_peak_during_any_bootstrap.items():
            if peak > h.tmp_budget_bytes:
                out.append(
                    f"{name}'s tmp reached {peak} bytes (budget {h.tmp_budget_bytes}) while "
                    f"{h.name} bootstrapped"
                )
        if h.tmp_peak_run_bytes > h.tmp_budget_bytes:
            out.append(f"{h.name}'s tmp peaked at {h.tmp_peak_run_bytes} bytes over the run")
    # Real clients: a hit after the run; during it, a run overlapped a reboot and every run
    # whose node stayed up got its hit.
    if not res.clients_skipped:
        for client in CLIENT_NAMES:
            after = [c for c in res.clients if c.phase == "after" and c.client == client]
            if not after or not all(c.hit for c in after):
                out.append(f"{client}: no REMOTE HIT after the run")
            before = [c for c in res.clients if c.phase == "before" and c.client == client]
            if not before or not all(c.hit for c in before):
                out.append(f"{client}: no REMOTE HIT before the run")
        during = [c for c in res.clients if c.phase == "during"]
        if not any(c.overlapped_reboot for c in during):
            out.append("no real client build ran while a host was rebooting")
        for c in during:
            if c.target_stayed_up and not c.hit:
                out.append(f"{c.client} against {c.host} (up throughout) got no hit during the run")
    if res.prometheus and not res.prometheus.get("rules_loaded_ok", False):
        out.append("prometheus did not load every alert rule")
    if not res.finished:
        out.append("the rolling reboot did not finish")
    return out
