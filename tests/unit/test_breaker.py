"""The object store's circuit breaker (``storage.breaker``) on virtual time."""

from __future__ import annotations

from kit.clock import ManualClock
from kura.storage.breaker import Breaker


def test_the_breaker_opens_after_failures_in_a_row_and_only_a_due_probe_goes_through() -> None:
    clock = ManualClock()
    breaker = Breaker(clock, failures_to_open=3, cooldown_seconds=10)
    for result in ("timeout", "unreachable"):
        assert breaker.enter() is False
        breaker.record(result)
    breaker.record("not_found")  # an answer: the count starts again
    for _ in range(3):
        assert breaker.enter() is False
        breaker.record("timeout")
    assert breaker.state.open
    assert breaker.state.opened_total == 1
    assert breaker.enter() is None  # a client's request is refused, unsent
    assert breaker.enter(probe=True) is None  # the cool-down is not over
    clock.advance(10)
    assert breaker.enter() is None  # never a client's request, even when a probe is due
    assert breaker.enter(probe=True) is True
    assert breaker.enter(probe=True) is None  # one probe at a time
    breaker.record("server_error")  # a request sent before it opened fails meanwhile
    assert breaker.enter(probe=True) is None  # the probe is still out
    breaker.record("timeout")  # the probe failed: another cool-down
    breaker.probe_ended()
    assert breaker.state.open
    assert breaker.enter(probe=True) is None
    clock.advance(10)
    assert breaker.enter(probe=True) is True
    breaker.probe_ended()  # cancelled before an answer: the next probe may go
    assert breaker.enter(probe=True) is True
    breaker.record("ok")
    breaker.probe_ended()
    assert not breaker.state.open  # transient: the first answer closes it
    assert breaker.enter() is False
    assert breaker.state.skipped_total == 2
    assert breaker.state.opened_total == 1
