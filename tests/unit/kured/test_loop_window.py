"""The agent's next check comes at the window's opening when that is sooner than ``--period``
(``kured.loop.until_window``): a window shorter than the period is never slept through."""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta
from zoneinfo import ZoneInfo

from kured.core.cron_window import parse_cron_window
from kured.core.window import RebootWindow
from kured.loop import until_window

HOUR = 3600.0


def test_a_closed_window_that_opens_before_the_next_check_wakes_the_agent_at_its_opening() -> None:
    window = parse_cron_window("0 3 * * *", 1800.0, "UTC")  # 03:00-03:30 every day
    now = datetime(2026, 12, 7, 2, 40, tzinfo=UTC)
    delay = until_window(window, now, HOUR)
    assert delay == 20 * 60
    assert window.contains(now + timedelta(seconds=delay))
    # Without it the check after 02:40 came at 03:40: the whole opening slept through.
    assert not window.contains(now + timedelta(seconds=HOUR))


def test_an_open_window_or_a_far_opening_keeps_the_period() -> None:
    window = parse_cron_window("0 3 * * *", 1800.0, "UTC")
    assert until_window(window, datetime(2026, 12, 7, 3, 10, tzinfo=UTC), HOUR) == HOUR
    assert until_window(window, datetime(2026, 12, 7, 12, 0, tzinfo=UTC), HOUR) == HOUR


def test_the_days_and_times_window_wakes_the_agent_too_in_its_zone() -> None:
    berlin = ZoneInfo("Europe/Berlin")
    window = RebootWindow(frozenset({0}), time(2, 0), time(2, 29, 59), berlin)  # Sundays
    now = datetime(2026, 12, 6, 0, 45, tzinfo=UTC)  # Sunday 01:45 in Berlin (CET)
    assert until_window(window, now, HOUR) == 15 * 60
    never = RebootWindow(frozenset(), time(2, 0), time(3, 0), berlin)  # no days: never opens
    assert until_window(never, now, HOUR) == HOUR


def test_the_check_falls_a_drawn_spread_into_the_opening_when_the_opening_is_long_enough() -> None:
    """A fleet's agents do not all check at the opening's instant: each is ``spread`` seconds
    into it; an opening shorter than the spread is checked at its start."""
    now = datetime(2026, 12, 7, 2, 40, tzinfo=UTC)
    long = parse_cron_window("0 3 * * *", 1800.0, "UTC")
    assert until_window(long, now, HOUR, spread=37.0) == 20 * 60 + 37
    short = parse_cron_window("0 3 * * *", 10.0, "UTC")  # 03:00:00-03:00:10
    delay = until_window(short, now, HOUR, spread=37.0)
    assert delay == 20 * 60
    assert short.contains(now + timedelta(seconds=delay))
