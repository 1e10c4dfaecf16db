"""``kura.rollout_gate.behind``: the conditions of ``kura admin rollout-gate`` on one look at
the mesh (the real mesh: tests/e2e/test_rollout_gate.py)."""

from __future__ import annotations

from typing import Any

from kura.rollout_gate import Look, behind

ME, PEER = "http://10.0.0.1:4100", "http://10.0.0.2:4100"


def row(url: str, **fields: Any) -> dict[str, Any]:
    return {
        "node_url": url,
        "healthy": True,
        "outbox_messages": 0,
        "needs_catch_up": False,
    } | fields


def seen(mine: dict[str, Any], theirs: dict[str, Any] | None, ready: bool = True) -> Look:
    status = {
        "node_url": ME,
        "reasons": [] if ready else ["bootstrap in progress"],
        "peers": [mine],
    }
    other = None if theirs is None else {"node_url": PEER, "peers": [theirs]}
    return Look(ready=ready, status=status, others={"http://peer:4000": other})


def test_in_step_both_ways_is_caught_up() -> None:
    assert behind(seen(row(PEER), row(ME))) == []


def test_a_peer_holding_messages_for_the_node_or_a_mark_holds_the_gate() -> None:
    assert behind(seen(row(PEER), row(ME, outbox_messages=2))) == [
        f"{PEER}'s view of this node: 2 outbox messages queued (at most 0)"
    ]
    assert behind(seen(row(PEER), row(ME, outbox_messages=2)), max_queued=2) == []
    marked = row(ME, needs_catch_up=True, catch_up_reason="queue_full")
    assert behind(seen(row(PEER), marked)) == [
        f"{PEER}'s view of this node: needs catch-up (queue_full)"
    ]


def test_not_ready_unlisted_and_unread_peers_hold_the_gate() -> None:
    assert behind(seen(row(PEER), row(ME), ready=False)) == ["not ready: bootstrap in progress"]
    assert behind(seen(row(PEER), row("http://someone-else"))) == [
        f"{PEER} does not list this node ({ME}) yet"
    ]
    unread = seen(row(PEER), None)
    assert behind(unread) == [
        f"{PEER}'s queue for this node not checked: pass that node's public URL with --mesh-url"
    ]
