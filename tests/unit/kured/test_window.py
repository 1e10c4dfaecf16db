"""The reboot window (kured.core.window): parsing, our day-of-start and DST rules, properties.

Example tests pin the rules stated in the module docstring, including where they part from
kured (a window crossing midnight belongs to the day it starts). Property tests check
``contains`` against two oracles written without the implementation's ``resolve``:

* ``interval_oracle`` builds each opening from a localiser that probes the zone's UTC offsets
  and walks a gap minute by minute;
* ``scan_oracle`` never localises anything: it scans the clock minute by minute and uses the
  "highest reading so far" of the local clock, which is what "the earliest instant at which the
  clock reads X or later" means.
"""

from __future__ import annotations

import functools
from datetime import UTC, date, datetime, time, timedelta, tzinfo
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kit.local_zone import local_zone
from kured.core.errors import ConfigurationError
from kured.core.window import (
    EVERY_DAY,
    FRIDAY,
    MONDAY,
    SATURDAY,
    SUNDAY,
    THURSDAY,
    TUESDAY,
    WEDNESDAY,
    RebootWindow,
    parse_days,
    parse_time,
    parse_window,
    parse_zone,
)

NY = ZoneInfo("America/New_York")
LONDON = ZoneInfo("Europe/London")
LORD_HOWE = ZoneInfo("Australia/Lord_Howe")
LA = ZoneInfo("America/Los_Angeles")
SECOND = timedelta(seconds=1)
MICRO = timedelta(microseconds=1)


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


def window(days: str, start: str, end: str, zone: str) -> RebootWindow:
    return parse_window(days.split(","), start, end, zone)


# --- parsing ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tokens", "expected"),
    [
        # kured's own days_test.go cases
        ("0,4", {SUNDAY, THURSDAY}),
        ("su,mo,tu", {SUNDAY, MONDAY, TUESDAY}),
        ("sunday,tu,thu", {SUNDAY, TUESDAY, THURSDAY}),
        ("THURSDAY", {THURSDAY}),
        ("we,WED,WeDnEsDaY", {WEDNESDAY}),
        ("", set()),
        (",,,", set()),
        # more spellings
        ("sa,sat,saturday,6", {SATURDAY}),
        ("Fr,FRI,Friday,5", {FRIDAY}),
        ("+3,03", {WEDNESDAY}),  # Go's strconv.Atoi
        ("mo, tu", {MONDAY, TUESDAY}),  # we trim spaces, kured does not
        ("0,1,2,3,4,5,6", set(EVERY_DAY)),
    ],
)
def test_day_tokens_parse_like_kured(tokens: str, expected: set[int]) -> None:
    assert parse_days(tokens.split(",")) == expected
    assert parse_days([tokens]) == expected


@pytest.mark.parametrize(
    "tokens", ["15", "-8", "8", "7", "-1", "mon,tue,wed,fridayyyy", "m", "1.0"]
)
def test_bad_day_tokens_are_rejected(tokens: str) -> None:
    with pytest.raises(ValueError, match="weekday"):
        parse_days(tokens.split(","))


def test_every_bad_day_token_is_named() -> None:
    with pytest.raises(ValueError, match="weekday") as raised:
        parse_days(["mo,funday", "9"])
    assert "funday" in str(raised.value)
    assert "'9'" in str(raised.value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("15:04", time(15, 4)),  # layout 15:04
        ("7:05", time(7, 5)),
        ("07:05", time(7, 5)),
        ("0:00", time(0, 0)),
        ("23:59:59", time(23, 59, 59)),  # layout 15:04:05
        ("1:02:03", time(1, 2, 3)),
        ("23:59:59.999", time(23, 59, 59)),  # Go accepts and kured drops a fraction
        ("23:59:59,5", time(23, 59, 59)),
        ("09:30am", time(9, 30)),  # layout 03:04pm
        ("09:30pm", time(21, 30)),
        ("12:15am", time(0, 15)),
        ("12:15pm", time(12, 15)),
        ("00:30am", time(0, 30)),  # Go's 12-hour range is 0-12
        ("17", time(17, 0)),  # layout 15
        ("0", time(0, 0)),
        ("05pm", time(17, 0)),  # layout 03pm
        ("5pm", time(17, 0)),  # layout 3pm
        ("9am", time(9, 0)),
        ("12am", time(0, 0)),
        ("12pm", time(12, 0)),
        ("0pm", time(12, 0)),  # Go's arithmetic: 0 + 12
    ],
)
def test_times_parse_exactly_as_kureds_go_layouts_accept(text: str, expected: time) -> None:
    assert parse_time(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "5:00pm",  # 12-hour with minutes needs a two-digit hour (Go's 03)
        "9:30am",
        "9AM",  # Go's pm element matches lower case only
        "09:30PM",
        "5 pm",
        "24:00",
        "24",
        "13pm",
        "12:60",
        "7:5",  # minutes are exactly two digits
        "07:05:6",
        " 9:00",
        "9:00 ",
        "1530",
        "007:00",
        "",
        "noon",
        "9:00:00am",
        "-1",
        "٣:٠٠",  # non-ASCII digits
        "23:59:59.",
    ],
)
def test_times_go_rejects_are_rejected(text: str) -> None:
    with pytest.raises(ValueError, match="not a time of day"):
        parse_time(text)


def test_zones_parse_like_gos_load_location() -> None:
    assert parse_zone("UTC") is UTC
    assert parse_zone("") is UTC
    assert parse_zone("Europe/Berlin") == ZoneInfo("Europe/Berlin")
    for bad in ("Mars/Olympus_Mons", "../../etc/passwd", "/etc/localtime", "Europe/"):
        with pytest.raises(ValueError, match="time zone"):
            parse_zone(bad)


@pytest.mark.parametrize(
    ("tz", "expected_offset_hours_in_january"),
    [
        ("", 0),  # Go: $TZ="" means UTC
        ("UTC", 0),
        ("Asia/Tokyo", 9),
        (":Asia/Tokyo", 9),
        ("/usr/share/zoneinfo/Asia/Tokyo", 9),
        ("Nowhere/Zone", 0),  # Go falls back to UTC
    ],
)
def test_local_zone_follows_tz_like_go(tz: str, expected_offset_hours_in_january: int) -> None:
    zone = parse_zone("Local", local=functools.partial(local_zone, {"TZ": tz}))
    offset = datetime(2024, 1, 15, 12, tzinfo=zone).utcoffset()
    assert offset == timedelta(hours=expected_offset_hours_in_january)


def test_local_zone_without_tz_is_a_usable_zone() -> None:
    zone = parse_zone("Local", local=functools.partial(local_zone, {}))
    assert datetime(2024, 1, 15, tzinfo=zone).utcoffset() is not None


def test_the_pure_core_refuses_local_when_not_told_the_hosts_zone() -> None:
    with pytest.raises(ValueError, match="Local"):
        parse_zone("Local")


def test_parse_window_reports_every_problem_at_once() -> None:
    with pytest.raises(ConfigurationError) as raised:
        parse_window(["mo", "xx"], "5:00pm", "25", "Mars/Base")
    problems = raised.value.problems
    assert len(problems) == 4
    assert [p.split(":")[0] for p in problems] == [
        "reboot days",
        "start time",
        "end time",
        "time zone",
    ]


def test_window_values_are_checked() -> None:
    with pytest.raises(ValueError, match="0-6"):
        RebootWindow(days=frozenset({7}))
    with pytest.raises(ValueError, match="whole-second"):
        RebootWindow(start=time(1, 0, 0, 5))


# --- evaluation: examples -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("days", "start", "end", "zone", "at", "expected"),
    [
        # kured's timewindow_test.go; none crosses midnight, so kured's rule and ours agree.
        ("mon,tue,wed,thu,fri", "9am", "5pm", LA, datetime(2019, 4, 4, 0, 49, tzinfo=LA), False),
        ("mon,tue,wed,thu,fri", "9am", "5pm", LA, datetime(2019, 4, 5, 8, 59, tzinfo=LA), False),
        ("mon,tue,wed,thu,fri", "9am", "5pm", LA, datetime(2019, 4, 5, 9, 1, tzinfo=LA), True),
        ("mon,tue,wed,thu,fri", "9am", "5pm", LA, datetime(2019, 3, 31, 10, 0, tzinfo=LA), False),
        ("mon,tue,wed,thu,fri", "9am", "5pm", LA, datetime(2019, 4, 4, 12, 0, tzinfo=LA), True),
        ("mon,tue,wed,thu,fri", "9am", "5pm", LA, utc(2019, 4, 4, 11, 59), False),
        ("mon,we,fri", "10:01", "11:30am", LA, datetime(2019, 4, 5, 10, 30, tzinfo=LA), True),
        ("mon,we,fri", "10:01", "11:30am", LA, datetime(2019, 4, 6, 10, 30, tzinfo=LA), False),
        ("mon,we,fri", "10:01", "11:30am", LA, datetime(2019, 4, 7, 10, 30, tzinfo=LA), False),
        ("mon,we,fri", "10:01", "11:30am", LA, datetime(2019, 4, 8, 10, 30, tzinfo=LA), True),
        ("mon,we,fri", "10:01", "11:30am", LA, datetime(2019, 4, 9, 10, 30, tzinfo=LA), False),
        ("mon,we,fri", "10:01", "11:30am", LA, datetime(2019, 4, 10, 10, 30, tzinfo=LA), True),
        ("mon,we,fri", "10:01", "11:30am", LA, datetime(2019, 4, 11, 10, 30, tzinfo=LA), False),
        ("mo,tu,we,th,fr", "00:00", "23:59:59", UTC, utc(2019, 4, 18, 0, 0), True),
        ("mo,tu,we,th,fr", "00:00", "23:59:59", UTC, utc(2019, 4, 18, 23, 59), True),
        # end second included, start inclusive
        ("mo,tu,we,th,fr", "00:00", "23:59:59", UTC, utc(2019, 4, 18, 23, 59, 59, 999999), True),
        ("mo,tu,we,th,fr", "9am", "5pm", UTC, utc(2019, 4, 18, 17, 0, 0, 999999), True),
        ("mo,tu,we,th,fr", "9am", "5pm", UTC, utc(2019, 4, 18, 17, 0, 1), False),
        ("mo,tu,we,th,fr", "9am", "5pm", UTC, utc(2019, 4, 18, 9, 0, 0), True),
        ("mo,tu,we,th,fr", "9am", "5pm", UTC, utc(2019, 4, 18, 8, 59, 59, 999999), False),
    ],
)
def test_kureds_own_cases_hold(
    days: str, start: str, end: str, zone: tzinfo, at: datetime, expected: bool
) -> None:
    w = parse_window(days.split(","), start, end, str(zone))
    assert w.contains(at) is expected


# 2024-03-01 is a Friday.
FRI = date(2024, 3, 1)


@pytest.mark.parametrize(
    ("at", "ours", "kureds"),
    [
        (datetime(2024, 3, 1, 0, 30), False, True),  # Fri early morning: kured opens it
        (datetime(2024, 3, 1, 21, 59, 59, 999999), False, False),
        (datetime(2024, 3, 1, 22, 0), True, True),  # start inclusive
        (datetime(2024, 3, 1, 23, 59, 59), True, True),
        (datetime(2024, 3, 2, 0, 0), True, False),  # Sat: kured closes the night at midnight
        (datetime(2024, 3, 2, 0, 30), True, False),
        (datetime(2024, 3, 2, 2, 0, 0, 999999), True, False),  # end second included
        (datetime(2024, 3, 2, 2, 0, 1), False, False),
        (datetime(2024, 2, 29, 23, 59), False, False),  # Thu night: Thursday is not listed
        (datetime(2024, 3, 8, 22, 30), True, True),  # next Friday
    ],
)
def test_a_window_crossing_midnight_belongs_to_the_day_it_starts(
    at: datetime, ours: bool, kureds: bool
) -> None:
    w = window("fri", "22:00", "02:00", "Europe/London")
    assert w.crosses_midnight
    assert w.contains(at.replace(tzinfo=LONDON)) is ours
    assert kured_contains(w, at.replace(tzinfo=LONDON)) is kureds


def kured_contains(w: RebootWindow, at: datetime) -> bool:
    """kured 1.23.0's rule (§2.10), for documenting where we differ. Not DST-exact."""
    local = at.astimezone(w.zone)
    if local.isoweekday() % 7 not in w.days:
        return False
    start = datetime.combine(local.date(), w.start, tzinfo=w.zone)
    end = datetime.combine(local.date(), w.end, tzinfo=w.zone) + SECOND - MICRO
    if w.start > w.end:
        if local < end:
            start -= timedelta(days=1)
        else:
            end += timedelta(days=1)
    return start <= local <= end


def test_a_window_crossing_midnight_on_every_day_is_open_all_night() -> None:
    w = window("su,mo,tu,we,th,fr,sa", "22:00", "06:00", "UTC")
    for hour in (22, 23, 0, 3, 5):
        assert w.contains(utc(2024, 3, 5 if hour >= 22 else 6, hour, 30))
    assert not w.contains(utc(2024, 3, 6, 6, 0, 1))
    assert not w.contains(utc(2024, 3, 6, 21, 59, 59))


def test_a_window_crossing_midnight_from_saturday_reaches_into_sunday_of_the_next_week() -> None:
    w = window("sa", "23:00", "01:00", "UTC")
    assert w.contains(utc(2024, 3, 3, 0, 59))  # Sunday 00:59, opened Saturday
    assert not w.contains(utc(2024, 3, 3, 23, 30))  # Sunday night is not Saturday's


def test_start_equal_to_end_is_a_one_second_window() -> None:
    w = window("mo", "03:00", "03:00:00", "UTC")
    monday = date(2024, 3, 4)
    at = datetime.combine(monday, time(3), tzinfo=UTC)
    assert w.contains(at)
    assert w.contains(at + SECOND - MICRO)
    assert not w.contains(at + SECOND)
    assert not w.contains(at - MICRO)
    assert not w.crosses_midnight


def test_an_empty_day_set_is_never_open() -> None:
    w = parse_window([""], "0:00", "23:59:59", "UTC")
    assert w.days == frozenset()
    at = utc(2024, 1, 1)
    assert not any(w.contains(at + timedelta(hours=h)) for h in range(0, 24 * 8, 5))
    assert w.next_open(at) is None
    assert w.describe().startswith("never")


def test_naive_instants_are_refused() -> None:
    w = RebootWindow()
    with pytest.raises(ValueError, match="timezone-aware"):
        w.contains(datetime(2024, 1, 1))
    with pytest.raises(ValueError, match="timezone-aware"):
        w.next_open(datetime(2024, 1, 1))


# --- DST --------------------------------------------------------------------------------------

# America/New_York: 2024-03-10 02:00 EST -> 03:00 EDT; 2024-11-03 02:00 EDT -> 01:00 EST.
# Europe/London: 2024-03-31 01:00 GMT -> 02:00 BST; 2024-10-27 02:00 BST -> 01:00 GMT.
# Australia/Lord_Howe: 2024-10-06 02:00 -> 02:30 (+10:30 -> +11); 2024-04-07 02:00 -> 01:30.


def test_new_york_a_start_in_the_spring_gap_opens_when_the_clock_jumps() -> None:
    w = window("su", "02:30", "03:30", "America/New_York")
    assert not w.contains(utc(2024, 3, 10, 6, 59, 59))  # 01:59:59 EST
    assert w.contains(utc(2024, 3, 10, 7, 0))  # 03:00 EDT: first instant after the gap
    assert w.contains(utc(2024, 3, 10, 7, 30, 0, 999999))  # 03:30:00.999 EDT
    assert not w.contains(utc(2024, 3, 10, 7, 30, 1))
    assert w.next_open(utc(2024, 3, 9)) == utc(2024, 3, 10, 7, 0)
    # An ordinary Sunday: 02:30 EST to 03:30 EST.
    assert w.next_open(utc(2024, 3, 11)) == utc(2024, 3, 17, 6, 30)


def test_new_york_an_ambiguous_time_means_its_first_occurrence() -> None:
    w = window("su", "01:30", "01:45", "America/New_York")
    first = datetime(2024, 11, 3, 1, 35, tzinfo=NY)  # fold=0: EDT, 05:35Z
    second = datetime(2024, 11, 3, 1, 35, fold=1, tzinfo=NY)  # EST, 06:35Z
    assert first.astimezone(UTC) == utc(2024, 11, 3, 5, 35)
    assert w.contains(first)
    # Python compares aware datetimes sharing a tzinfo by wall clock; we compare instants.
    assert not w.contains(second)
    assert w.next_open(utc(2024, 11, 2)) == utc(2024, 11, 3, 5, 30)


def test_new_york_a_window_over_the_fall_back_hour_lasts_two_real_hours() -> None:
    w = window("su", "01:00", "02:00", "America/New_York")
    open_at, close_at = w.opening(date(2024, 11, 3))
    assert (open_at, close_at) == (utc(2024, 11, 3, 5, 0), utc(2024, 11, 3, 7, 0, 1))
    assert w.contains(utc(2024, 11, 3, 6, 30))  # 01:30 EST, the repeated hour


def test_new_york_three_to_six_is_three_real_hours_on_both_change_days() -> None:
    # kured-behaviour.md §2.10: no boundary lands in the switch hour.
    w = window("su", "03:00", "06:00", "America/New_York")
    for day in (date(2024, 3, 10), date(2024, 11, 3)):
        open_at, close_at = w.opening(day)
        assert close_at - open_at == timedelta(hours=3, seconds=1)


def test_new_york_a_night_window_spanning_spring_forward_is_an_hour_shorter() -> None:
    w = window("sa", "22:00", "06:00", "America/New_York")
    open_at, close_at = w.opening(date(2024, 3, 9))
    assert open_at == utc(2024, 3, 10, 3, 0)  # Sat 22:00 EST
    assert close_at == utc(2024, 3, 10, 10, 0, 1)  # Sun 06:00:00.999 EDT
    assert w.contains(utc(2024, 3, 10, 10, 0))
    assert not w.contains(utc(2024, 3, 10, 10, 0, 1))


def test_london_spring_forward_and_fall_back() -> None:
    w = window("su", "01:30", "02:30", "Europe/London")
    # 01:30 does not exist on 2024-03-31: the window opens at 02:00 BST = 01:00Z.
    assert w.opening(date(2024, 3, 31)) == (utc(2024, 3, 31, 1, 0), utc(2024, 3, 31, 1, 30, 1))
    assert not w.contains(utc(2024, 3, 31, 0, 59, 59, 999999))
    assert w.contains(utc(2024, 3, 31, 1, 0))
    # On 2024-10-27 01:30 happens twice; the window opens at the first (BST, 00:30Z) and
    # closes at 02:30 GMT, the only 02:30.
    assert w.opening(date(2024, 10, 27)) == (utc(2024, 10, 27, 0, 30), utc(2024, 10, 27, 2, 30, 1))
    one_second = window("su", "01:30", "01:30", "Europe/London")
    assert one_second.contains(utc(2024, 10, 27, 0, 30))
    assert not one_second.contains(utc(2024, 10, 27, 1, 30))  # the second 01:30


def test_lord_howe_half_hour_changes() -> None:
    # Both ends inside the 30-minute spring gap: one second, at the jump.
    inside = window("su", "02:10", "02:20", "Australia/Lord_Howe")
    jump = utc(2024, 10, 5, 15, 30)  # 02:30 +11
    assert inside.opening(date(2024, 10, 6)) == (jump, jump + SECOND)
    assert inside.contains(jump)
    assert not inside.contains(jump + SECOND)
    across = window("su", "02:00", "02:45", "Australia/Lord_Howe")
    assert across.opening(date(2024, 10, 6)) == (jump, utc(2024, 10, 5, 15, 45, 1))
    # Fall back 02:00 -> 01:30: 01:40 happens at 14:40Z (+11) and again at 15:10Z (+10:30).
    repeated = window("su", "01:40", "01:50", "Australia/Lord_Howe")
    assert repeated.contains(utc(2024, 4, 6, 14, 40))
    assert not repeated.contains(utc(2024, 4, 6, 15, 10))
    assert repeated.next_open(utc(2024, 4, 6)) == utc(2024, 4, 6, 14, 40)


def test_a_skipped_calendar_day_still_opens_its_window() -> None:
    # Samoa skipped 2011-12-30 (a Friday): the clock went from Thu 23:59:59 to Sat 00:00.
    w = window("fri", "22:00", "02:00", "Pacific/Apia")
    skip = utc(2011, 12, 30, 10, 0)
    assert w.opening(date(2011, 12, 30)) == (skip, utc(2011, 12, 30, 12, 0, 1))
    assert w.contains(skip)


# --- next_open and describe ------------------------------------------------------------------


def test_next_open_is_after_itself_while_open_and_the_next_start_otherwise() -> None:
    w = window("fri", "22:00", "02:00", "Europe/London")
    monday = utc(2024, 2, 26, 12)
    assert w.next_open(monday) == utc(2024, 3, 1, 22, 0)
    inside = datetime(2024, 3, 2, 1, 0, 0, 5, tzinfo=LONDON)
    assert w.next_open(inside) == inside.astimezone(UTC)
    assert w.next_open(utc(2024, 3, 2, 2, 0, 1)) == utc(2024, 3, 8, 22, 0)
    # Summer time: 22:00 BST is 21:00Z.
    assert w.next_open(utc(2024, 6, 3)) == utc(2024, 6, 7, 21, 0)


@pytest.mark.parametrize(
    ("w", "text"),
    [
        (RebootWindow(), "every day 00:00:00 to 23:59:59 (end second included), UTC"),
        (
            parse_window(["fr", "sa"], "22:00", "2am", "Europe/London"),
            "Fri, Sat 22:00:00 to 02:00:00 next day (end second included), Europe/London",
        ),
        (
            parse_window(["sunday"], "3", "3", "America/New_York"),
            "Sun at 03:00:00 for one second, America/New_York",
        ),
        (parse_window([","], "3", "4", "UTC"), "never (no reboot days), UTC"),
    ],
)
def test_describe(w: RebootWindow, text: str) -> None:
    assert w.describe() == text


# --- properties -------------------------------------------------------------------------------

ZONES = [
    "UTC",
    "America/New_York",
    "Europe/London",
    "Europe/Dublin",  # negative DST in tzdata
    "Australia/Lord_Howe",  # 30-minute DST
    "America/Santiago",  # changes at midnight
    "America/Sao_Paulo",  # changed at midnight until 2019
    "Pacific/Chatham",  # +12:45 / +13:45
    "Asia/Kathmandu",  # +5:45, no DST
    "Africa/Casablanca",  # several changes a year around Ramadan
    "America/St_Johns",  # -3:30 / -2:30
]
YEARS = (2017, 2026)


def offset_changes(zone: ZoneInfo) -> list[datetime]:
    """Every instant in YEARS at which ``zone``'s UTC offset changes (hourly scan + bisection)."""
    return _offset_changes(str(zone))


@functools.cache
def _offset_changes(key: str) -> list[datetime]:
    zone = ZoneInfo(key)
    found = []
    t = utc(YEARS[0], 1, 1)
    end = utc(YEARS[1] + 1, 1, 1)
    step = timedelta(hours=1)
    previous = t.astimezone(zone).utcoffset()
    while t < end:
        nxt = t + step
        offset = nxt.astimezone(zone).utcoffset()
        if offset != previous:
            lo, hi = t, nxt
            while hi - lo > SECOND:
                mid = lo + (hi - lo) / 2
                mid = mid.replace(microsecond=0)
                if mid.astimezone(zone).utcoffset() == previous:
                    lo = mid
                else:
                    hi = mid
            found.append(hi)
            previous = offset
        t = nxt
    return found


def wall(instant: datetime, zone: tzinfo) -> datetime:
    return instant.astimezone(zone).replace(tzinfo=None)


def probe_localize(naive: datetime, zone: tzinfo) -> datetime:
    """Oracle localiser: try every UTC offset the zone uses within two days; if none reads
    ``naive``, walk forward minute by minute, then back second by second, to the first instant
    reading later than it."""
    as_utc = naive.replace(tzinfo=UTC)
    offsets = set()
    for hours in range(-48, 49):
        off = (as_utc + timedelta(hours=hours)).astimezone(zone).utcoffset()
        assert off is not None
        offsets.add(off)
    readers = [as_utc - off for off in offsets if wall(as_utc - off, zone) == naive]
    if readers:
        return min(readers)
    u = min(as_utc - off for off in offsets)
    while wall(u, zone) < naive:
        u += timedelta(minutes=1)
    while wall(u - SECOND, zone) >= naive:
        u -= SECOND
    return u


def interval_oracle(w: RebootWindow, at: datetime) -> bool:
    local_day = wall(at, w.zone).date()
    for k in range(-3, 3):
        day = local_day + timedelta(days=k)
        if day.isoweekday() % 7 not in w.days:
            continue
        end_day = day + timedelta(days=1) if w.start > w.end else day
        opens = probe_localize(datetime.combine(day, w.start), w.zone)
        closes = probe_localize(datetime.combine(end_day, w.end), w.zone) + SECOND
        if opens <= at < closes:
            return True
    return False


def scan_oracle(w: RebootWindow, at: datetime) -> bool:
    """No localising: the window opened on day D is open at ``at`` iff the local clock has read
    D+start (or later) at some instant <= at, and had not read E+end (or later) by at - 1 s.
    "Highest reading so far" comes from a minute-by-minute scan of the past four days, plus
    the reading one second before each offset change (the clock's last reading before a jump
    back or forward) and the readings at ``at`` and ``at - 1 s``."""
    at_utc = at.astimezone(UTC)
    scan_from = at_utc.replace(second=0, microsecond=0) - timedelta(days=4)

    def highest(until: datetime) -> datetime:
        best = wall(until, w.zone)
        u = scan_from
        previous = u.astimezone(w.zone).utcoffset()
        while u <= until:
            local = u.astimezone(w.zone)
            best = max(best, local.replace(tzinfo=None))
            if local.utcoffset() != previous and u - SECOND <= until:
                best = max(best, wall(u - SECOND, w.zone))
            previous = local.utcoffset()
            u += timedelta(minutes=1)
        return best

    reached = highest(at_utc)
    reached_before = highest(at_utc - SECOND)
    local_day = wall(at_utc, w.zone).date()
    for k in range(-3, 2):
        day = local_day + timedelta(days=k)
        if day.isoweekday() % 7 not in w.days:
            continue
        end_day = day + timedelta(days=1) if w.start > w.end else day
        if reached >= datetime.combine(day, w.start) and reached_before < datetime.combine(
            end_day, w.end
        ):
            return True
    return False


INTERESTING_TIMES = [
    time(0, 0),
    time(0, 30),
    time(1, 0),
    time(1, 30),
    time(1, 45),
    time(2, 0),
    time(2, 15),
    time(2, 30),
    time(2, 59, 59),
    time(3, 0),
    time(12, 0),
    time(22, 0),
    time(23, 0),
    time(23, 30),
    time(23, 59, 59),
]

zones = st.sampled_from(ZONES).map(ZoneInfo)
day_sets = st.frozensets(st.integers(0, 6))
minute_times = st.builds(time, st.integers(0, 23), st.integers(0, 59))
second_times = st.one_of(
    st.sampled_from(INTERESTING_TIMES),
    minute_times,
    st.builds(time, st.integers(0, 23), st.integers(0, 59), st.integers(0, 59)),
)


@st.composite
def windows(draw: st.DrawFn, times: st.SearchStrategy[time] = second_times) -> RebootWindow:
    return RebootWindow(draw(day_sets), draw(times), draw(times), draw(zones))


@st.composite
def instants_for(draw: st.DrawFn, zone: tzinfo) -> datetime:
    """Anywhere in YEARS, or within a day of one of the zone's offset changes."""
    changes = offset_changes(zone) if isinstance(zone, ZoneInfo) else []
    if changes and draw(st.booleans()):
        base = draw(st.sampled_from(changes))
        seconds = draw(st.integers(-26 * 3600, 26 * 3600))
        micros = draw(st.sampled_from([0, 0, 999_999, 500_000]))
        return base + timedelta(seconds=seconds, microseconds=micros)
    start = utc(YEARS[0], 1, 8)
    seconds = draw(st.integers(0, (utc(YEARS[1], 12, 20) - start) // SECOND))
    return start + timedelta(seconds=seconds, microseconds=draw(st.integers(0, 999_999)))


@st.composite
def around_a_change(draw: st.DrawFn, with_seconds: bool) -> tuple[RebootWindow, datetime]:
    """A window whose start and end sit near the wall times of one offset change (inside the
    gap or the repeated hour, at its edges, or across midnight), and an instant near it."""
    zone = ZoneInfo(draw(st.sampled_from([z for z in ZONES if z != "UTC"])))
    changes = offset_changes(zone)
    if not changes:  # a zone without changes in YEARS: any window will do
        return draw(windows(second_times if with_seconds else minute_times)), utc(2024, 6, 1)
    change = draw(st.sampled_from(changes))
    edges = (wall(change - SECOND, zone) + SECOND, wall(change, zone))

    def near() -> time:
        shift = timedelta(minutes=draw(st.integers(-90, 90)))
        if with_seconds:
            shift += timedelta(seconds=draw(st.sampled_from([0, 0, 1, 59])))
        return (draw(st.sampled_from(edges)) + shift).time()

    days = draw(day_sets)
    if draw(st.booleans()):
        days |= {edges[1].isoweekday() % 7, (edges[1] - timedelta(days=1)).isoweekday() % 7}
    start = near() if draw(st.booleans()) else draw(minute_times)
    end = near() if draw(st.booleans()) else draw(minute_times)
    seconds = draw(st.integers(-30 * 3600, 30 * 3600))
    micros = draw(st.sampled_from([0, 0, 999_999, 1]))
    return RebootWindow(days, start, end, zone), change + timedelta(
        seconds=seconds, microseconds=micros
    )


@st.composite
def window_and_instant(draw: st.DrawFn, with_seconds: bool = True) -> tuple[RebootWindow, datetime]:
    if draw(st.integers(0, 2)) == 0:
        return draw(around_a_change(with_seconds))
    w = draw(windows(second_times if with_seconds else minute_times))
    return w, draw(instants_for(w.zone))


@settings(max_examples=600, deadline=None)
@given(window_and_instant())
def test_contains_agrees_with_an_offset_probing_interval_oracle(
    case: tuple[RebootWindow, datetime],
) -> None:
    w, at = case
    assert w.contains(at) is interval_oracle(w, at)
    # The instant may be given in any zone: only the instant matters.
    assert w.contains(at.astimezone(w.zone)) is w.contains(at)
    assert w.contains(at.astimezone(NY)) is w.contains(at)


@settings(max_examples=150, deadline=None)
@given(window_and_instant())
def test_contains_agrees_with_a_minute_scan_of_the_local_clock(
    case: tuple[RebootWindow, datetime],
) -> None:
    w, at = case
    assert w.contains(at) is scan_oracle(w, at)


@settings(max_examples=150, deadline=None)
@given(window_and_instant())
def test_openings_start_and_end_exactly_where_contains_says(
    case: tuple[RebootWindow, datetime],
) -> None:
    w, at = case
    day = wall(at, w.zone).date()
    open_at, close_at = w.opening(day)
    assert open_at < close_at
    if day.isoweekday() % 7 in w.days:
        assert w.contains(open_at)
        assert w.contains(close_at - MICRO)
        # Just outside, the window is open only where a neighbouring day's opening abuts
        # (a change at midnight can make them touch).
        before, after = open_at - MICRO, close_at
        previous, following = day - timedelta(days=1), day + timedelta(days=1)
        prev_open, prev_close = w.opening(previous)
        next_open, _ = w.opening(following)
        assert w.contains(before) is (
            previous.isoweekday() % 7 in w.days and prev_open <= before < prev_close
        )
        assert w.contains(after) is (following.isoweekday() % 7 in w.days and next_open <= after)
    assert open_at == probe_localize(datetime.combine(day, w.start), w.zone)


@settings(max_examples=80, deadline=None)
@given(window_and_instant(with_seconds=False))
def test_next_open_is_the_first_open_instant(case: tuple[RebootWindow, datetime]) -> None:
    w, at = case
    nxt = w.next_open(at)
    if not w.days:
        assert nxt is None
        return
    assert nxt is not None
    assert nxt >= at
    assert nxt.utcoffset() == timedelta(0)
    assert w.contains(nxt)
    if nxt > at:
        assert not w.contains(nxt - MICRO)
    # No whole minute strictly between ``at`` and ``nxt`` is open.
    minute = at.replace(second=0, microsecond=0) + timedelta(minutes=1)
    while minute < nxt:
        assert not w.contains(minute), minute
        minute += timedelta(minutes=1)
    assert nxt - at <= timedelta(days=8)
