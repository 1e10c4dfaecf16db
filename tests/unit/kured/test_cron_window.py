"""The cron window (kured.core.cron_window): parsing, our DST rule, and properties against a
minute-by-minute oracle.

The oracle shares nothing with the implementation: no cronsim, no ``resolve``. Expressions are
drawn as *structures* (the sets of minutes, hours, months and the day rule) and rendered into
cron text in several spellings (lists, ranges, steps, names, ``#n``, ``L``); the oracle matches
wall minutes against the structure, stepping minute by minute through the wall clock, and
localises each matching minute with ``probe_localize`` from test_window (which probes the
zone's offsets and walks gaps, without ``resolve``). Openings start at whole wall minutes and
last whole seconds, so the oracle's openings are exact instants, not minute-stepped guesses.
"""

from __future__ import annotations

import calendar
import functools
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta, tzinfo
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kured.core.cron_window import CronWindow, check_expression, parse_cron_window
from kured.core.errors import ConfigurationError
from tests.unit.kured.test_window import (
    MICRO,
    SECOND,
    instants_for,
    offset_changes,
    probe_localize,
    utc,
    wall,
)

BERLIN = ZoneInfo("Europe/Berlin")
MINUTE = timedelta(minutes=1)
ZONES = [
    "UTC",
    "Europe/Berlin",
    "America/New_York",
    "America/Santiago",  # changes at midnight
    "Pacific/Apia",  # DST until 2021; skipped 2011-12-30
    "Australia/Lord_Howe",  # 30-minute DST
]
DAY_NAMES = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]
MONTH_NAMES = [m.lower() for m in calendar.month_abbr[1:]]


def cron(expression: str, duration: timedelta, zone: str = "UTC") -> CronWindow:
    return parse_cron_window(expression, duration.total_seconds(), zone)


# --- the oracle -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    """A cron expression as sets: what the oracle matches against."""

    minutes: frozenset[int]
    hours: frozenset[int]
    months: frozenset[int]
    # ("any",), ("dom", days), ("dow", weekdays 0=Sun), ("nth", weekday, n), ("last_dom",),
    # ("last_dow", weekday)
    day: tuple[object, ...]

    def day_matches(self, d: date) -> bool:
        if d.month not in self.months:
            return False
        kind = self.day[0]
        dow = d.isoweekday() % 7
        last = calendar.monthrange(d.year, d.month)[1]
        if kind == "any":
            return True
        if kind == "dom":
            return d.day in self.day[1]  # type: ignore[operator]
        if kind == "dow":
            return dow in self.day[1]  # type: ignore[operator]
        if kind == "nth":
            return dow == self.day[1] and (d.day - 1) // 7 + 1 == self.day[2]
        if kind == "last_dom":
            return d.day == last
        assert kind == "last_dow"
        return dow == self.day[1] and d.day + 7 > last

    def starts_on(self, d: date) -> list[datetime]:
        """The matching wall minutes of date ``d``, ascending."""
        if not self.day_matches(d):
            return []
        return [
            datetime.combine(d, time(h, m))
            for h in sorted(self.hours)
            for m in sorted(self.minutes)
        ]


@functools.lru_cache(maxsize=100_000)
def localize(naive: datetime, key: str) -> datetime:
    return probe_localize(naive, ZoneInfo(key) if key != "UTC" else UTC)


def zone_key(zone: tzinfo) -> str:
    return str(zone)


MARGIN = timedelta(hours=3)  # beyond any change in ZONES: a start may resolve that far away


def oracle_contains(spec: Spec, duration: timedelta, zone: tzinfo, at: datetime) -> bool:
    """Step the wall clock minute by minute over every reading whose opening could cover
    ``at``; open iff one of them starts at or before ``at`` and lasts past it."""
    key = zone_key(zone)
    minute = (wall(at - duration, zone) - MARGIN).replace(second=0, microsecond=0)
    end = wall(at, zone) + MARGIN
    while minute <= end:
        if (
            minute.minute in spec.minutes
            and minute.hour in spec.hours
            and spec.day_matches(minute.date())
        ):
            start = localize(minute, key)
            if start <= at < start + duration:
                return True
        minute += MINUTE
    return False


def oracle_next_open(
    spec: Spec, duration: timedelta, zone: tzinfo, at: datetime
) -> datetime | None:
    """``at`` when open; else the first opening start after it: the wall clock stepped
    forward minute by minute (through the days that match) from a little before ``at``."""
    if oracle_contains(spec, duration, zone, at):
        return at
    key = zone_key(zone)
    day = (wall(at, zone) - MARGIN).date()
    for _ in range(366 * 30):
        for minute in spec.starts_on(day):
            start = localize(minute, key)
            if start > at:
                return start
        day += timedelta(days=1)
    return None


# --- strategies: structures rendered as cron text -----------------------------------------------


@st.composite
def field(
    draw: st.DrawFn, low: int, high: int, names: list[str] | None = None
) -> tuple[str, frozenset[int]]:
    """One numeric field: its text and the set it means."""
    full = frozenset(range(low, high + 1))
    kind = draw(st.sampled_from(["star", "one", "list", "range", "step", "range_step"]))
    if kind == "star":
        return "*", full
    if kind == "one":
        v = draw(st.integers(low, high))
        text = names[v - low] if names and draw(st.booleans()) else str(v)
        return text, frozenset({v})
    if kind == "list":
        values = sorted(draw(st.sets(st.integers(low, high), min_size=1, max_size=4)))
        return ",".join(str(v) for v in values), frozenset(values)
    a = draw(st.integers(low, high))
    b = draw(st.integers(a, high))
    if kind == "range":
        text = f"{names[a - low]}-{names[b - low]}" if names and draw(st.booleans()) else f"{a}-{b}"
        return text, frozenset(range(a, b + 1))
    step = draw(st.integers(1, max(1, (high - low) // 2)))
    if kind == "step":
        return f"*/{step}", frozenset(range(low, high + 1, step))
    return f"{a}-{b}/{step}", frozenset(range(a, b + 1, step))


@st.composite
def day_field(draw: st.DrawFn) -> tuple[str, str, tuple[object, ...]]:
    """(day-of-month text, day-of-week text, the day rule)."""
    kind = draw(st.sampled_from(["any", "dom", "dow", "nth", "last_dom", "last_dow", "sun7"]))
    if kind == "any":
        return "*", "*", ("any",)
    if kind == "dom":
        text, days = draw(field(1, 28))
        if text.startswith("*"):
            # '*' and '*/n' reach the 31st, not field()'s 28 (cron(5): the whole field).
            step = int(text.partition("/")[2] or 1)
            days = frozenset(range(1, 32, step))
        return text, "*", ("dom", days)
    if kind == "dow":
        text, days = draw(field(0, 6, DAY_NAMES))
        return "*", text, ("dow", days)
    if kind == "sun7":
        return "*", "7", ("dow", frozenset({0}))  # cron(5): 0 and 7 are both Sunday
    weekday = draw(st.integers(0, 6))
    name = DAY_NAMES[weekday] if draw(st.booleans()) else str(weekday)
    if kind == "nth":
        n = draw(st.integers(1, 5))
        return "*", f"{name}#{n}", ("nth", weekday, n)
    if kind == "last_dom":
        return "L", "*", ("last_dom",)
    return "*", f"{weekday}L", ("last_dow", weekday)


# Few starts per day keep the oracle quick; a full-hour minute set is drawn now and then.
minute_fields = st.one_of(field(0, 59), st.just(("*/15", frozenset({0, 15, 30, 45}))))


@st.composite
def specs(draw: st.DrawFn) -> tuple[str, Spec]:
    minute_text, minutes = draw(minute_fields)
    hour_text, hours = draw(field(0, 23))
    dom, dow, day = draw(day_field())
    month_text, months = draw(
        st.one_of(st.just(("*", frozenset(range(1, 13)))), field(1, 12, MONTH_NAMES))
    )
    expression = f"{minute_text} {hour_text} {dom} {month_text} {dow}"
    return expression, Spec(minutes, hours, months, day)


durations = st.one_of(
    st.integers(1, 3 * 3600).map(lambda s: timedelta(seconds=s)),
    st.sampled_from([timedelta(hours=2), timedelta(minutes=30), timedelta(hours=26)]),
)


@st.composite
def near_a_change(draw: st.DrawFn) -> tuple[str, Spec, str, datetime]:
    """An expression whose starts sit at wall minutes around one of the zone's offset changes
    (in the gap, the repeated stretch, at their edges), on that day, and an instant near it."""
    key = draw(st.sampled_from([z for z in ZONES if z != "UTC"]))
    zone = ZoneInfo(key)
    change = draw(st.sampled_from(offset_changes(zone)))
    edge = draw(st.sampled_from([wall(change - SECOND, zone) + SECOND, wall(change, zone)]))
    starts = [
        edge + timedelta(minutes=draw(st.integers(-90, 90))) for _ in range(draw(st.integers(1, 3)))
    ]
    minutes = frozenset(s.minute for s in starts)
    hours = frozenset(s.hour for s in starts)
    day_of = starts[0].date()
    if draw(st.booleans()):
        dom_text, dow_text, rule = (
            "*",
            str(day_of.isoweekday() % 7),
            ("dow", frozenset({day_of.isoweekday() % 7})),
        )
    else:
        dom_text, dow_text, rule = str(day_of.day), "*", ("dom", frozenset({day_of.day}))
    expression = (
        f"{','.join(map(str, sorted(minutes)))} {','.join(map(str, sorted(hours)))} "
        f"{dom_text} {day_of.month} {dow_text}"
    )
    spec = Spec(minutes, hours, frozenset({day_of.month}), rule)
    at = change + timedelta(seconds=draw(st.integers(-30 * 3600, 30 * 3600)))
    at += timedelta(microseconds=draw(st.sampled_from([0, 0, 1, 999_999])))
    return expression, spec, key, at


@st.composite
def cases(draw: st.DrawFn) -> tuple[CronWindow, Spec, datetime]:
    duration = draw(durations)
    if draw(st.integers(0, 2)) == 0:
        expression, spec, key, at = draw(near_a_change())
    else:
        expression, spec = draw(specs())
        key = draw(st.sampled_from(ZONES))
        zone = UTC if key == "UTC" else ZoneInfo(key)
        at = draw(instants_for(zone))
    return cron(expression, duration, key), spec, at


@settings(max_examples=300, deadline=None)
@given(cases())
def test_contains_agrees_with_a_minute_by_minute_oracle(
    case: tuple[CronWindow, Spec, datetime],
) -> None:
    w, spec, at = case
    assert w.contains(at) is oracle_contains(spec, w.duration, w.zone, at), w
    # Only the instant matters, not the zone it is written in.
    assert w.contains(at.astimezone(w.zone)) is w.contains(at)


@settings(max_examples=150, deadline=None)
@given(cases())
def test_next_open_is_the_first_opening_the_oracle_finds(
    case: tuple[CronWindow, Spec, datetime],
) -> None:
    w, spec, at = case
    nxt = w.next_open(at)
    assert nxt == oracle_next_open(spec, w.duration, w.zone, at), w
    assert nxt is not None
    assert nxt.utcoffset() == timedelta(0)
    assert w.contains(nxt)
    if nxt > at:
        assert not w.contains(nxt - MICRO)


@settings(max_examples=100, deadline=None)
@given(cases())
def test_openings_follow_one_another_and_are_where_contains_says(
    case: tuple[CronWindow, Spec, datetime],
) -> None:
    w, _, at = case
    assert w.describe().startswith(f"cron '{w.expression}' (")  # cronsim explains every one
    found = list(w.openings(at, 3))
    assert len(found) == 3
    starts = [o for o, _ in found]
    assert starts == sorted(set(starts))
    assert all(o > at and c - o == w.duration for o, c in found)
    assert starts[0] == w.next_open(at) or w.contains(at)
    for open_at, close_at in found:
        assert w.contains(open_at)
        assert w.contains(close_at - MICRO)


# --- examples ---------------------------------------------------------------------------------

FIRST_SUNDAY = "0 3 * * sun#1"


def test_first_sunday_of_the_month_in_berlin_across_both_dst_changes() -> None:
    w = cron(FIRST_SUNDAY, timedelta(hours=2), "Europe/Berlin")
    # 2024: CET (+1) until 2024-03-31, CEST (+2) until 2024-10-27, then CET.
    expected = [
        utc(2024, 3, 3, 2, 0),  # 03:00 CET
        utc(2024, 4, 7, 1, 0),  # 03:00 CEST
        utc(2024, 10, 6, 1, 0),  # 03:00 CEST
        utc(2024, 11, 3, 2, 0),  # 03:00 CET
    ]
    starts = [o for o, _ in w.openings(utc(2024, 2, 15), 9)]
    assert [s for s in starts if s.month in (3, 4, 10, 11)] == expected
    for start in expected:
        assert not w.contains(start - MICRO)
        assert w.contains(start)
        assert w.contains(start + timedelta(hours=2) - MICRO)
        assert not w.contains(start + timedelta(hours=2))  # 05:00:00 is closed
    # From the March change and the October change, the next openings.
    assert w.next_open(utc(2024, 3, 31, 1, 0)) == utc(2024, 4, 7, 1, 0)
    assert w.next_open(utc(2024, 10, 27, 1, 0)) == utc(2024, 11, 3, 2, 0)
    # Inside an opening, next_open is the instant itself.
    inside = datetime(2024, 4, 7, 4, 59, tzinfo=BERLIN)
    assert w.next_open(inside) == inside.astimezone(UTC)


def test_the_duration_is_elapsed_time_across_a_change() -> None:
    # Last Sunday of March, 01:00 Berlin for 3h: 00:00Z to 03:00Z, which reads 05:00 CEST.
    spring = cron("0 1 * 3 0L", timedelta(hours=3), "Europe/Berlin")
    assert next(spring.openings(utc(2024, 3, 1), 1)) == (utc(2024, 3, 31, 0), utc(2024, 3, 31, 3))
    # Last Sunday of October, 02:00 Berlin (read twice): the first one, 00:00Z, for 2h.
    autumn = cron("0 2 * 10 0L", timedelta(hours=2), "Europe/Berlin")
    assert next(autumn.openings(utc(2024, 10, 1), 1)) == (
        utc(2024, 10, 27, 0),
        utc(2024, 10, 27, 2),
    )
    assert not autumn.contains(utc(2024, 10, 27, 2))  # 03:00 CET; 02:00 CET was 01:00Z


def test_a_start_in_the_spring_gap_opens_at_the_jump() -> None:
    w = cron("30 2 * 3 sun", timedelta(minutes=30), "Europe/Berlin")
    # 2024-03-31 02:30 does not exist in Berlin: 01:00Z, when the clock jumps to 03:00 CEST.
    assert w.next_open(utc(2024, 3, 30, 12)) == utc(2024, 3, 31, 1, 0)
    assert w.contains(utc(2024, 3, 31, 1, 29, 59))
    assert not w.contains(utc(2024, 3, 31, 1, 30))
    # A repeated 02:30 in New York's fall-back: the first occurrence, EDT.
    ny = cron("30 1 3 11 *", timedelta(minutes=10), "America/New_York")
    assert ny.next_open(utc(2024, 11, 1)) == utc(2024, 11, 3, 5, 30)
    assert not ny.contains(utc(2024, 11, 3, 6, 35))  # 01:35 EST, the second 01:35


def test_an_opening_crossing_midnight_runs_into_the_next_day() -> None:
    w = cron("0 22 * * fri", timedelta(hours=6))
    assert w.contains(utc(2024, 3, 2, 3, 59, 59))  # Saturday 03:59:59, opened Friday
    assert not w.contains(utc(2024, 3, 2, 4, 0))
    assert not w.contains(utc(2024, 3, 1, 21, 59))
    assert w.next_open(utc(2024, 3, 2, 4, 0)) == utc(2024, 3, 8, 22, 0)


def test_santiago_a_start_at_midnight_on_the_change_day() -> None:
    # America/Santiago 2024-09-08: 00:00 -04 jumps to 01:00 -03. Midnight does not exist.
    w = cron("0 0 8 9 *", timedelta(hours=1), "America/Santiago")
    assert w.next_open(utc(2024, 9, 1)) == utc(2024, 9, 8, 4, 0)
    # 2024-04-07: 00:00 -03 falls back to 23:00 -04 on the 6th; 23:30 on the 6th is read
    # twice, and opens at the first.
    late = cron("30 23 6 4 *", timedelta(minutes=10), "America/Santiago")
    assert late.next_open(utc(2024, 4, 1)) == utc(2024, 4, 7, 2, 30)


def test_a_skipped_calendar_day_still_opens_once() -> None:
    # Samoa skipped 2011-12-30: every start that day opens at the jump, 10:00Z, once.
    w = cron("0 3,9 30 12 *", timedelta(hours=1), "Pacific/Apia")
    opened = list(w.openings(utc(2011, 12, 29), 2))
    assert opened[0] == (utc(2011, 12, 30, 10), utc(2011, 12, 30, 11))
    assert opened[1][0] > utc(2012, 12, 1)  # the next one is a year later
    assert w.contains(utc(2011, 12, 30, 10, 59))


def test_overlapping_openings_are_open_through_their_union() -> None:
    w = cron("*/30 * * * *", timedelta(hours=1))
    at = utc(2024, 5, 5, 12, 7)
    assert all(w.contains(at + timedelta(minutes=m)) for m in range(0, 24 * 60, 13))


@pytest.mark.parametrize(
    ("expression", "needle"),
    [
        ("0 3 30 2 *", "30th of February"),  # never matches: refused at parse time
        ("0 3 31 4,6 *", "30th of February"),
        ("0 3 1-7 * sun", "sun#1"),  # cron(5) would OR the two day fields
        ("0 3 15 * 1", "day of week"),
        ("0 3 * *", "five fields"),
        ("0 0 3 * * sun", "five fields"),  # no seconds field
        ("61 3 * * *", "minute"),
        ("0 3 * * funday", "day-of-week"),
        ("", "five fields"),
    ],
)
def test_bad_expressions_are_refused_with_the_reason(expression: str, needle: str) -> None:
    with pytest.raises(ValueError, match=r"cron expression|restricts both") as raised:
        check_expression(expression)
    assert needle in str(raised.value)
    with pytest.raises(ConfigurationError):
        parse_cron_window(expression, 3600, "UTC")


def test_day_fields_starting_with_a_star_combine_as_cron5_does() -> None:
    # Vixie cron: a day field starting with '*' makes the two an AND.
    w = cron("0 3 */2 * sun", timedelta(minutes=1))
    assert w.next_open(utc(2024, 3, 1)) == utc(2024, 3, 3, 3)  # the 3rd, a Sunday, odd day
    assert w.next_open(utc(2024, 3, 4)) == utc(2024, 3, 17, 3)  # not the 10th: even


def test_parse_reports_every_problem_and_normalises_the_expression() -> None:
    with pytest.raises(ConfigurationError) as raised:
        parse_cron_window("0 3 1-7 * sun", 0, "Mars/Base")
    assert [p.split(":")[0] for p in raised.value.problems] == [
        "window cron",
        "window duration",
        "time zone",
    ]
    assert parse_cron_window("  0  3 * *   sun#1 ", 60, "UTC").expression == FIRST_SUNDAY


def test_windows_refuse_naive_instants_and_short_durations() -> None:
    w = cron(FIRST_SUNDAY, timedelta(hours=2))
    with pytest.raises(ValueError, match="timezone-aware"):
        w.contains(datetime(2024, 1, 1))
    with pytest.raises(ValueError, match="timezone-aware"):
        w.next_open(datetime(2024, 1, 1))
    with pytest.raises(ValueError, match="at least one second"):
        CronWindow(FIRST_SUNDAY, timedelta(milliseconds=500))


def test_describe() -> None:
    w = cron(FIRST_SUNDAY, timedelta(hours=2), "Europe/Berlin")
    assert w.describe() == (
        "cron '0 3 * * sun#1' (At 03:00 on the first Sunday of the month), each opening 2h, "
        "Europe/Berlin"
    )
    assert (
        cron("30 22 * * fri", timedelta(minutes=90)).describe().endswith("each opening 1h30m, UTC")
    )


def test_the_ends_of_the_calendar_are_no_further_opening_not_an_error() -> None:
    # cronsim raises OverflowError when its search steps past year 9999 (or before year 1).
    leap = cron("0 3 29 2 *", timedelta(hours=2))
    assert leap.next_open(datetime(9997, 1, 1, tzinfo=UTC)) is None
    assert list(leap.openings(datetime(9997, 1, 1, tzinfo=UTC), 5)) == []
    assert leap.last_start(datetime(1, 2, 1, tzinfo=UTC)) is None
    assert not leap.contains(datetime(1, 2, 1, tzinfo=UTC))
    # The last opening before the end still counts, and one ending past it is open to its end.
    last = cron("0 23 31 12 *", timedelta(hours=2))
    assert last.next_open(datetime(9999, 12, 1, tzinfo=UTC)) == datetime(
        9999, 12, 31, 23, tzinfo=UTC
    )
    assert last.contains(datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC))
    assert list(last.openings(datetime(9999, 12, 1, tzinfo=UTC), 5)) == [
        (datetime(9999, 12, 31, 23, tzinfo=UTC), datetime.max.replace(tzinfo=UTC))
    ]


def test_a_one_value_range_with_a_step_is_that_value_as_in_cron5() -> None:
    # cronsim 2.8 reads '3-3/2' as '3/2' (the 3rd, 5th, 7th, ...); cron(5) as the 3rd alone.
    w = cron("0 3 3-3/2 * *", timedelta(hours=1))
    starts = [o[0] for o in w.openings(datetime(2024, 1, 1, tzinfo=UTC), 3)]
    assert starts == [datetime(2024, m, 3, 3, tzinfo=UTC) for m in (1, 2, 3)]
