"""``kit.log_limit.LogLimit`` on virtual time: a budget of lines per window, and the count of
the events left out carried by the next line admitted."""

from __future__ import annotations

import pytest

from kit.log_limit import LogLimit


def test_at_most_the_budget_per_window_and_the_next_line_counts_what_was_left_out() -> None:
    now = [0.0]
    limit = LogLimit(3, 60.0, clock=lambda: now[0])
    assert [limit.admit() for _ in range(10)] == [0, 0, 0] + [None] * 7
    now[0] = 59.9
    assert limit.admit() is None
    now[0] = 60.0  # a new window: the first line says 8 were left out
    assert [limit.admit() for _ in range(4)] == [8, 0, 0, None]
    now[0] = 500.0
    assert limit.admit() == 1


@pytest.mark.parametrize(("lines", "interval"), [(0, 1.0), (1, 0.0)])
def test_a_budget_that_admits_nothing_is_refused(lines: int, interval: float) -> None:
    with pytest.raises(ValueError, match="needs lines"):
        LogLimit(lines, interval)
