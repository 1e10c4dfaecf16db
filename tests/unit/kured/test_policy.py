"""Property tests of the reboot decision's invariants (kured.core.policy)."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from kured.core.policy import Action, GateResult, Observation, Why, decide

gates = st.lists(
    st.builds(
        GateResult,
        name=st.sampled_from(["prometheus", "gate http://n1/ready"]),
        blocking=st.sampled_from([True, False, None]),
        detail=st.text(max_size=20),
    ),
    max_size=3,
).map(tuple)

observations = st.builds(
    Observation,
    now=st.just(datetime(2026, 11, 30, 3, 30, tzinfo=UTC)),
    reboot_required=st.sampled_from([True, False, None]),
    sentinel_detail=st.just("sentinel"),
    window_open=st.booleans(),
    gates=gates,
    holds_lock=st.sampled_from([True, False, None]),
    lock_holders=st.lists(st.sampled_from(["n1", "n2"]), max_size=2, unique=True).map(tuple),
    reboot_triggered=st.booleans(),
    rebooted_holding_lock=st.booleans(),
    breaker_open=st.booleans(),
    held_off_until=st.sampled_from([None, datetime(2026, 12, 1, 3, 30, tzinfo=UTC)]),
)


def everything_allows_a_reboot(o: Observation) -> bool:
    return (
        o.window_open
        and o.reboot_required is True
        and all(g.blocking is False for g in o.gates)
        and not o.breaker_open
        and o.held_off_until is None
    )


@given(observations)
def test_never_reboots_outside_the_window_with_a_gate_closed_or_unknown_or_without_the_lock(
    o: Observation,
) -> None:
    d = decide(o)
    if d.action is Action.REBOOT:
        assert everything_allows_a_reboot(o)
        assert o.holds_lock is True
        assert not o.reboot_triggered
        assert not o.rebooted_holding_lock


@given(observations)
def test_only_takes_the_lock_when_nothing_but_the_lock_is_missing(o: Observation) -> None:
    d = decide(o)
    if d.action is Action.ACQUIRE:
        assert everything_allows_a_reboot(o)
        assert o.holds_lock is False


@given(observations)
def test_a_blocked_node_never_keeps_the_lock(o: Observation) -> None:
    d = decide(o)
    if o.holds_lock and not o.reboot_triggered and not everything_allows_a_reboot(o):
        assert d.action is Action.RELEASE


@given(observations)
def test_after_triggering_a_reboot_it_only_holds(o: Observation) -> None:
    if o.reboot_triggered:
        assert decide(o).action is Action.HOLD


@given(observations)
def test_every_non_reboot_decision_says_why(o: Observation) -> None:
    d = decide(o)
    if d.action is not Action.REBOOT:
        assert d.reasons
        assert d.why is not Why.NONE
        assert d.first


def test_the_first_reason_names_the_firing_alert() -> None:
    o = Observation(
        now=datetime(2026, 11, 30, tzinfo=UTC),
        reboot_required=True,
        sentinel_detail="",
        window_open=True,
        gates=(GateResult("prometheus", True, "alert NodeDiskPressure firing"),),
        holds_lock=False,
        lock_holders=(),
    )
    d = decide(o)
    assert d.action is Action.NOTHING
    assert d.first == "blocked: alert NodeDiskPressure firing"
    assert d.why is Why.GATE_BLOCKED


def test_an_unreachable_prometheus_blocks_with_that_reason() -> None:
    o = Observation(
        now=datetime(2026, 11, 30, tzinfo=UTC),
        reboot_required=True,
        sentinel_detail="",
        window_open=True,
        gates=(GateResult("prometheus", None, "prometheus http://p unreachable"),),
        holds_lock=False,
        lock_holders=(),
    )
    d = decide(o)
    assert d.action is Action.NOTHING
    assert "unreachable" in d.first
    assert d.why is Why.GATE_UNKNOWN
