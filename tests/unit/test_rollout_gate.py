"""``kura.rollout_gate.behind``: the conditions of ``kura admin rollout-gate`` on one look at
the mesh (the real mesh: tests/e2e/test_rollout_gate.py)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from kura.cli import build_parser, main
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
        f"{PEER}'s queue for this node not checked: --mesh-url http://peer:4000 is down or "
        "unreachable (its /status could not be read); if that is not this peer, pass its "
        "public URL with --mesh-url"
    ]
    # Given under the URL the node lists it by, and down: said so, not "pass it".
    down = Look(ready=True, status=unread.status, others={PEER: None})
    assert behind(down) == [
        f"{PEER}'s queue for this node not checked: {PEER} is down or unreachable (its /status "
        "could not be read)"
    ]
    not_given = Look(ready=True, status=unread.status, others={})
    assert behind(not_given) == [
        f"{PEER}'s queue for this node not checked: pass that node's public URL with --mesh-url"
    ]


def test_a_mesh_node_the_node_does_not_list_is_looked_at_too() -> None:
    """Discovery gave up on it or membership has not admitted it: its queue for the node and
    its catch-up mark still hold the gate, and so does the node not listing it."""
    waiting = row(ME, outbox_messages=7, needs_catch_up=True)
    unlisted = Look(
        ready=True,
        status={"node_url": ME, "peers": []},
        others={"http://peer:4000": {"node_url": PEER, "peers": [waiting]}},
    )
    assert behind(unlisted) == [
        f"{PEER} is in the mesh but this node does not list it",
        f"{PEER}'s view of this node: 7 outbox messages queued (at most 0)",
        f"{PEER}'s view of this node: needs catch-up (queue dropped)",
    ]
    unlisted.others["http://peer:4000"] = {"node_url": PEER, "peers": []}
    assert behind(unlisted) == [f"{PEER} is in the mesh but this node does not list it"]


def test_a_peer_the_node_cannot_talk_to_holds_the_gate_without_any_write() -> None:
    """Healthy, nothing queued, but of a wire outside the looking node's range: only the
    warning and the row's wire version say so. Absent fields (kura 0.1.0) hold nothing."""
    cannot = f"peer {PEER}: kura 0.3.0 (wire 3) and this node, kura 0.2.0 ... cannot talk: ..."
    look = seen(row(PEER, wire_version=3), row(ME, wire_version=2))
    assert look.status is not None
    look.status |= {"wire_version": 2, "min_wire_version": 1, "warnings": [cannot]}
    assert behind(look) == [f"{ME}: {cannot}", f"{ME}: peer {PEER} runs wire 3, outside 1-2"]
    unparseable = seen(row(PEER), row(ME, wire_version=0))
    assert unparseable.others["http://peer:4000"] is not None
    unparseable.others["http://peer:4000"] |= {"wire_version": 3, "min_wire_version": 3}
    assert behind(unparseable) == [f"{PEER}: peer {ME} runs wire 0, outside 3-3"]
    # A 0.2.0 /status seeing a 0.1.0 peer (wire 1), and a 0.1.0 /status: nothing to hold.
    mixed = seen(row(PEER, wire_version=1), row(ME))
    assert mixed.status is not None
    mixed.status |= {"wire_version": 2, "min_wire_version": 1, "warnings": ["mixed versions"]}
    assert behind(mixed) == []


def test_the_command_takes_a_read_token_and_has_no_json_nor_data_dir(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for ignored in ("--json", "--data-dir=/d"):
        with pytest.raises(SystemExit) as exited:
            build_parser().parse_args(["admin", "rollout-gate", ignored])
        assert exited.value.code == 2
    assert main(["admin", "--json", "rollout-gate"]) == 2  # the admin-level flag, refused too
    assert "it has no --json" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        build_parser().parse_args(["admin", "rollout-gate", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "a read token for /status" in shown
    assert "clean token" not in shown


@pytest.mark.parametrize(
    "argv",
    [
        ["--url", "notaurl"],
        ["--url", "ftp://kura-0:4000"],
        ["--url", "http://"],
        ["--url", "http://kura-0:port"],
        ["--url", "http://127.0.0.1:1", "--mesh-url", "http://127.0.0.1:2,kura-1:4000"],
    ],
)
def test_a_url_without_an_http_scheme_and_host_is_refused_at_once(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit 2 before any look, not after waiting out --wait (exit 5)."""
    started = time.monotonic()
    assert main(["admin", "rollout-gate", "--wait", "30", *argv]) == 2
    assert time.monotonic() - started < 5
    err = capsys.readouterr().err
    assert "kura admin rollout-gate: argument --" in err
    assert "is not an http(s) URL with a host" in err or "has an invalid port" in err


@pytest.mark.parametrize("flag", ["--timeout", "--wait"])
@pytest.mark.parametrize("value", ["-1", "nan", "inf", "-inf", "soon"])
def test_timeout_and_wait_are_validated_alike(
    flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["admin", "rollout-gate", f"{flag}={value}"])
    assert exited.value.code == 2
    assert f"argument {flag}: {value!r} is not" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["admin", "rollout-gate", "--timeout=0"],
        ["admin", "--timeout=0", "namespaces"],
        ["status", "--timeout=0"],
    ],
)
def test_a_request_timeout_of_0_is_refused(argv: list[str]) -> None:
    """A request timeout must be positive; ``--wait 0`` is one look (tests/e2e)."""
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(argv)
    assert exited.value.code == 2
    assert build_parser().parse_args(["admin", "rollout-gate", "--wait=0"]).wait == 0
