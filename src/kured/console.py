"""``kured status``: the JSON an agent serves on ``/status``, and how it reads on a terminal."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from kured.core.policy import Action
from kured.loop import Agent


def _iso(unix: float | None) -> str:
    return "" if unix is None else datetime.fromtimestamp(unix, tz=UTC).isoformat()


def lock_condition(agent: Agent) -> dict[str, Any]:
    """The lock as last read from the store (``kured.lockview``): held or not, and whether
    that is stale (the last read failed), with its age."""
    lv = agent.lock_view
    now = agent.now()
    holds = any(h.node_id == agent.config.node_id and not h.expired(now) for h in lv.holders)
    age = lv.age_seconds()
    if age is None:
        return {
            "name": "lock",
            "ok": False,
            "value": "unknown" + (f": {lv.error}" if lv.error else " (not read yet)"),
        }
    value = "held by this node" if holds else "not held"
    if lv.stale:
        value += f" (stale: last read {age:.0f}s ago; {lv.error})"
    return {"name": "lock", "ok": holds and not lv.stale, "value": value}


def lock_read(agent: Agent) -> dict[str, Any]:
    """When the holders shown were read, and whether they are stale."""
    lv = agent.lock_view
    age = lv.age_seconds()
    return {
        "read_at": _iso(lv.read_at) or None,
        "age_seconds": None if age is None else round(age, 3),
        "stale": lv.stale,
        "error": lv.error,
    }


def maintenance_of(agent: Agent) -> dict[str, Any]:
    """The maintenance around a reboot (``kured.maintenance``): since when, what it waits for,
    the silence held, the last hook failure."""
    m, st = agent.view.maintenance, agent.state
    failure = m.last_hook_failure
    return {
        "active": st.maintenance_since is not None,
        "since": _iso(st.maintenance_since) or None,
        "rebooted": st.maintenance_rebooted,
        "phase": m.phase,
        "silence": (
            {"id": m.silence_id, "ends_at": _iso(m.silence_ends_at) or None}
            if m.silence_id
            else None
        ),
        "silence_expiry_pending": agent.silence_sweep_pending,
        "last_hook_failure": (
            {"at": _iso(failure[0]), "message": failure[1]} if failure is not None else None
        ),
    }


def status_of(agent: Agent, window_description: str) -> dict[str, Any]:
    """This node's conditions, the first thing blocking a reboot, and the lock holders."""
    view = agent.view
    obs, decision = view.observation, view.decision
    now = agent.now()
    conditions: list[dict[str, Any]] = []
    if obs is not None:
        conditions.append(
            {
                "name": "window",
                "ok": obs.window_open,
                "value": ("open" if obs.window_open else "closed")
                + f" ({window_description})"
                + (
                    f", next opening {obs.next_window_at.isoformat()}" if obs.next_window_at else ""
                ),
            }
        )
        conditions.append(
            {
                "name": "sentinel",
                "ok": bool(obs.reboot_required),
                "value": (
                    "required"
                    if obs.reboot_required
                    else "unknown"
                    if obs.reboot_required is None
                    else "not required"
                )
                + f": {obs.sentinel_detail}",
            }
        )
        for g in obs.gates:
            conditions.append(
                {
                    "name": g.name,
                    "ok": g.blocking is False,
                    "value": ("unknown: " if g.blocking is None else "") + g.detail,
                }
            )
        conditions.append(lock_condition(agent))
        conditions.append(
            {
                "name": "circuit breaker",
                "ok": not agent.state.breaker_open,
                "value": ("open: " + obs.breaker_detail)
                if agent.state.breaker_open
                else f"closed ({agent.state.consecutive_reboots} in a row)",
            }
        )
    first_check = (
        f"first check at {_iso(view.next_check_at)}"
        if view.next_check_at is not None
        else "first check once start-up recovery is done"
    )
    return {
        "node": agent.config.node_id,
        "action": decision.action.value if decision else "starting",
        "rebooting": decision is not None and decision.action in (Action.REBOOT, Action.HOLD),
        "blocked_by": decision.first if decision else first_check,
        "next_check_at": _iso(view.next_check_at) or None,
        "reason": decision.why.value if decision else "none",
        "reasons": [r.text for r in decision.reasons] if decision else [],
        "conditions": conditions,
        "lock_holders": [
            {
                "node": h.node_id,
                "created": h.created_raw or h.created_at.isoformat(),
                "ttl_seconds": h.ttl_seconds,
                "unschedulable": h.unschedulable,
                "expired": h.expired(now),
                "stale": agent.lock_view.stale,
            }
            for h in agent.lock_view.holders
        ],
        "lock": lock_read(agent),
        "last_tick_at": view.last_tick_at,
        "failures": dict(view.failures_total),
        "last_drain_failure": (
            {
                "at": view.last_drain_failure.at,
                "message": view.last_drain_failure.message,
                "pods": list(view.last_drain_failure.pods),
                "action": view.last_drain_failure.action,
            }
            if view.last_drain_failure is not None
            else None
        ),
        "maintenance": maintenance_of(agent),
    }


def render(status: dict[str, Any]) -> str:
    lines = [f"node      {status['node']}"]
    first = status["blocked_by"] or "rebooting" if status["rebooting"] else status["blocked_by"]
    lines.append(f"status    {first or 'ready to reboot'}")
    for c in status["conditions"]:
        mark = "ok " if c["ok"] else "-- "
        lines.append(f"  {mark}{c['name']:<16} {c['value']}")
    holders = status["lock_holders"]
    read = status.get("lock") or {}
    if read.get("stale"):
        age = read.get("age_seconds")
        when = f"{age:.0f}s old" if age is not None else "never read"
        lines.append(f"lock holders are STALE ({when}): {read.get('error')}")
    if holders:
        lines.append("lock holders:")
        for h in holders:
            ttl = "never expires" if not h["ttl_seconds"] else f"ttl {h['ttl_seconds']:.0f}s"
            lines.append(
                f"  {h['node']:<20} since {h['created']} ({ttl}"
                f"{', EXPIRED' if h['expired'] else ''}"
                f"{', was cordoned' if h['unschedulable'] else ''})"
            )
    else:
        lines.append("lock holders: none")
    drain = status.get("last_drain_failure")
    if drain:
        lines.append(f"last drain failure ({drain['action']}): {drain['message']}")
    m = status.get("maintenance") or {}
    if m.get("active"):
        lines.append(f"maintenance since {m['since']}: {m['phase'] or 'in progress'}")
    if m.get("silence"):
        s = m["silence"]
        lines.append(f"alertmanager silence {s['id']} until {s['ends_at']}")
    if m.get("silence_expiry_pending"):
        lines.append("alertmanager silence expiry PENDING (alertmanager unreachable; retried)")
    if m.get("last_hook_failure"):
        h = m["last_hook_failure"]
        lines.append(f"last hook failure at {h['at']}: {h['message']}")
    return "\n".join(lines)
