"""The reboot window: which instants a node may start a reboot in.

This module owns parsing kured's window flags (``--reboot-days``, ``--start-time``,
``--end-time``, ``--time-zone``) and the ``RebootWindow`` value that answers "is the window open
at this instant?" and "when does it next open?". It is pure: no clock, no asyncio, no
environment. The one thing it reads is time-zone data, through ``zoneinfo``; the zone named
``Local`` is resolved by the caller's function (``kit.local_zone``, exactly as Go resolves it).

Parsing (kured 1.23.0 ``pkg/timewindow``, docs/reference/kured-behaviour.md §2.10):

* Days: case-insensitive ``su sun sunday mo mon monday tu tue tuesday we wed wednesday th thu
  thursday fr fri friday sa sat saturday``, or an integer 0-6 with 0 = Sunday (Go's
  ``strconv.Atoi``, so ``+3`` and ``03`` are 3). Empty tokens are skipped, so an explicitly empty
  list is the empty set, which means the window is **never** open. Days are numbered as kured
  numbers them: 0 = Sunday ... 6 = Saturday (``date.isoweekday() % 7``), not Python's
  ``date.weekday()``. Unlike kured we trim spaces around a token (``mo, tu``).
* Times: kured tries the Go layouts ``15:04``, ``15:04:05``, ``03:04pm``, ``15``, ``03pm``,
  ``3pm`` in turn; ``parse_time`` accepts exactly what one of them accepts. So ``7:05``, ``07:05``,
  ``23:59:59``, ``17``, ``09:30am``, ``5pm``, ``05pm`` and ``12am`` (midnight) parse, while
  ``5:00pm`` (a 12-hour hour with minutes needs two digits), ``9AM`` (Go's ``pm`` layout element
  only matches lower case), ``24:00``, ``7:5`` and `` 9:00`` do not. Go also takes a fraction
  after the seconds (``23:59:59.5``) and then ignores it, as kured does; so do we. Resolution is
  one second.
* Zone: an IANA name, ``UTC`` or the empty string (UTC, like Go's ``LoadLocation``), or
  ``Local``: ``$TZ`` when set (empty means UTC, a leading ``:`` is dropped, an absolute path is a
  zone file), else ``/etc/localtime``, else UTC.

Evaluation, OUR rules. For every calendar date D (in the window's zone) whose weekday is one of
the days, the window has one *opening*, the half-open interval of instants

    [ resolve(D, start),  resolve(E, end) + 1 s )

where E = D when start <= end, and E = the day after D when start > end (the window crosses
midnight). ``contains(t)`` is true iff the instant t lies in some opening; instants are compared
in UTC, never as wall-clock readings. ``resolve(date, time)`` is **the earliest instant at which
the local clock reads that date and time or later**. That one rule settles DST:

* a wall time that exists once is that instant;
* a wall time that does not exist (skipped by a spring-forward change) is the instant the clock
  jumps past it: 02:30 on the spring-forward day in America/New_York is 03:00 EDT (07:00 UTC);
* a wall time that occurs twice (fall back) is its first occurrence: 01:30 on the fall-back day
  in America/New_York is 01:30 EDT (05:30 UTC).

Consequences: start is inclusive; the end second is wholly included (kured: end + 999 999 999 ns);
``start == end`` is a one-second window; an opening lasts at least one second, because
``resolve`` never goes backwards as the wall time advances (both ends inside one spring-forward
gap give exactly one second, at the jump). Two days' openings can touch or overlap when a change
at midnight falls between them (America/Santiago); the window is then open through both. A date
the zone skipped entirely (Pacific/Apia, 2011-12-30) still has its opening, at the jump.

Where this differs from kured, and why:

* A window that crosses midnight belongs to the day it **starts**. ``days=fri, 22:00-02:00`` is
  open Fri 22:00 until Sat 02:00:00.999, and not Fri 00:00-02:00. kured applies the day filter to
  the weekday of the instant being tested, so the same flags open Fri 00:00-02:00 and
  Fri 22:00-24:00 and never Sat 00:30: a "Friday night" window that is closed half of Friday
  night and open on Friday's early morning, which nobody configures on purpose.
* DST boundaries are defined instants (above). kured hands a nonexistent or repeated wall time
  to Go's ``time.Date``, whose documentation does not promise which instant it picks, and it
  moves a wrapped window's start or end by 24 h of elapsed time (``Add(24 * time.Hour)``) rather
  than by one calendar day, so a wrapped window spanning a DST change is an hour off at one end.
* kured compares instants too (Go's ``time.Time`` comparisons are instants). A port must not
  compare aware Python datetimes sharing one tzinfo: Python compares those by wall clock, which
  gives wrong answers inside the repeated hour. Everything here is converted to UTC first.

kured only checks the window at the start of a tick; so does our agent loop. That is the loop's
business, not this module's.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from kured.core.errors import ConfigurationError

SUNDAY, MONDAY, TUESDAY, WEDNESDAY, THURSDAY, FRIDAY, SATURDAY = range(7)
EVERY_DAY: frozenset[int] = frozenset(range(7))
DAY_NAMES = ("Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat")

_DAY_TOKENS: dict[str, int] = {}
for _number, _names in enumerate(
    (
        ("su", "sun", "sunday"),
        ("mo", "mon", "monday"),
        ("tu", "tue", "tuesday"),
        ("we", "wed", "wednesday"),
        ("th", "thu", "thursday"),
        ("fr", "fri", "friday"),
        ("sa", "sat", "saturday"),
    )
):
    for _name in _names:
        _DAY_TOKENS[_name] = _number

_ATOI = re.compile(r"[+-]?[0-9]+")
_ONE_SECOND = timedelta(seconds=1)


def weekday_of(day: date) -> int:
    """``day``'s weekday in kured's numbering: 0 = Sunday ... 6 = Saturday."""
    return day.isoweekday() % 7


def parse_day(token: str) -> int:
    """One day token (see module docstring) as 0 = Sunday ... 6 = Saturday.

    Raises ValueError for anything else, including the empty string.
    """
    text = token.strip()
    if _ATOI.fullmatch(text):
        number = int(text)
        if 0 <= number <= 6:
            return number
        raise ValueError(f"weekday number {token!r} out of range 0-6 (0 = Sunday)")
    found = _DAY_TOKENS.get(text.lower())
    if found is None:
        raise ValueError(f"{token!r} is not a weekday (su/sun/sunday ... sa/sat/saturday or 0-6)")
    return found


def parse_days(tokens: Iterable[str]) -> frozenset[int]:
    """A set of days from tokens, each of which may itself be a comma-separated list.

    Empty tokens are skipped, so ``[]``, ``[""]`` and ``[",,"]`` are the empty set (never open).
    Raises ValueError naming every bad token.
    """
    days: set[int] = set()
    bad: list[str] = []
    for token in tokens:
        for part in token.split(","):
            if not part.strip():
                continue
            try:
                days.add(parse_day(part))
            except ValueError as exc:
                bad.append(str(exc))
    if bad:
        raise ValueError("; ".join(bad))
    return frozenset(days)


# Go layout elements used by kured's time layouts: (kind, fixed width). "h24" is Go's ``15``
# (1-2 digits, 0-23), "h12" is ``3`` (1-2 digits, 0-12), "h12z" is ``03`` (exactly 2 digits,
# 0-12), "min"/"sec" are ``04``/``05`` (exactly 2 digits, 0-59), "pm" is ``pm`` (exactly
# ``am`` or ``pm``, lower case), ":" is a literal.
_LAYOUTS: tuple[tuple[str, ...], ...] = (
    ("h24", ":", "min"),  # 15:04
    ("h24", ":", "min", ":", "sec"),  # 15:04:05
    ("h12z", ":", "min", "pm"),  # 03:04pm
    ("h24",),  # 15
    ("h12z", "pm"),  # 03pm
    ("h12", "pm"),  # 3pm
)


def _getnum(text: str, fixed: bool) -> tuple[int, str] | None:
    """Go's ``getnum``: one or (when ``fixed``, exactly) two leading ASCII digits."""
    if not text[:1].isascii() or not text[:1].isdigit():
        return None
    if not text[1:2].isascii() or not text[1:2].isdigit():
        return None if fixed else (int(text[0]), text[1:])
    return int(text[:2]), text[2:]


def _parse_layout(text: str, layout: tuple[str, ...]) -> time | None:
    """``text`` read with one Go layout (see ``_LAYOUTS``), or None if Go would reject it."""
    rest = text
    hour = minute = second = 0
    meridiem = ""
    for element in layout:
        if element == ":":
            if not rest.startswith(":"):
                return None
            rest = rest[1:]
        elif element == "pm":
            meridiem, rest = rest[:2], rest[2:]
            if meridiem not in ("am", "pm"):
                return None
        else:
            got = _getnum(rest, fixed=element in ("h12z", "min", "sec"))
            if got is None:
                return None
            value, rest = got
            if element == "h24":
                if value > 23:
                    return None
                hour = value
            elif element in ("h12", "h12z"):
                if value > 12:
                    return None
                hour = value
            elif value > 59:
                return None
            elif element == "min":
                minute = value
            else:
                second = value
                # Go accepts a fraction after the seconds even when the layout has none.
                frac = re.match(r"[.,][0-9]+", rest)
                if frac is not None:
                    rest = rest[frac.end() :]
    if rest:
        return None  # Go: "extra text"
    if meridiem == "pm" and hour < 12:
        hour += 12
    elif meridiem == "am" and hour == 12:
        hour = 0
    return time(hour, minute, second)


def parse_time(text: str) -> time:
    """A time of day as kured's Go layouts accept it (module docstring), at second resolution.

    Raises ValueError if no layout accepts ``text``.
    """
    for layout in _LAYOUTS:
        parsed = _parse_layout(text, layout)
        if parsed is not None:
            return parsed
    raise ValueError(
        f"{text!r} is not a time of day (accepted forms: 15:04, 15:04:05, 03:04pm, 15, 03pm, "
        "3pm; am/pm in lower case)"
    )


def parse_zone(name: str, *, local: Callable[[], tzinfo] | None = None) -> tzinfo:
    """A time zone by IANA name; ``UTC`` and ``""`` are UTC; ``Local`` is ``local()``, the host's
    zone as Go resolves it (``kit.local_zone.local_zone``: it reads ``$TZ`` and
    ``/etc/localtime``, which this pure module does not).

    Raises ValueError for an unknown or malformed name, and for ``Local`` without ``local``.
    """
    if name in ("", "UTC"):
        return UTC
    if name == "Local":
        if local is None:
            raise ValueError("'Local' (the host's zone) is not known here; name an IANA zone")
        return local()
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ValueError(
            f"{name!r} is not a known time zone (an IANA name such as Europe/Berlin, UTC or Local)"
        ) from None


def _wall(instant: datetime, zone: tzinfo) -> datetime:
    """The naive local reading of the clock in ``zone`` at ``instant``."""
    return instant.astimezone(zone).replace(tzinfo=None, fold=0)


@functools.lru_cache(maxsize=4096)
def resolve(day: date, wall_time: time, zone: tzinfo) -> datetime:
    """The earliest instant (UTC) at which the clock in ``zone`` reads ``day wall_time`` or later.

    So an existing wall time is itself, a repeated one is its first occurrence, and a skipped one
    is the end of the gap (the instant of the change). Cached: windows ask for the same few dates
    over and over.
    """
    naive = datetime.combine(day, wall_time)
    # Reading the wall time with the offsets in force on either side of any nearby change gives
    # every instant that can show it. (PEP 495: fold selects the side.)
    candidates = sorted({naive.replace(tzinfo=zone, fold=fold).astimezone(UTC) for fold in (0, 1)})
    for instant in candidates:
        if _wall(instant, zone) == naive:
            return instant
    # A gap. The change lies between the two candidates: before it the clock reads less than
    # ``naive``, from it on more. Find it to the second (zone changes are on whole seconds).
    lo, hi = candidates[0], candidates[-1]
    if _wall(lo, zone) >= naive:  # pragma: no cover - a zone whose data contradicts itself
        return lo
    while hi - lo > _ONE_SECOND:
        mid = lo + timedelta(seconds=(hi - lo) // _ONE_SECOND // 2)
        if _wall(mid, zone) >= naive:
            hi = mid
        else:
            lo = mid
    return hi


def _utc(instant: datetime) -> datetime:
    if instant.tzinfo is None or instant.utcoffset() is None:
        raise ValueError("a timezone-aware datetime is required")
    return instant.astimezone(UTC)


@dataclass(frozen=True)
class RebootWindow:
    """Days (0 = Sunday ... 6 = Saturday), start and end wall times, and a zone.

    ``start`` and ``end`` are whole seconds. Immutable and safe to share between threads (the
    ``resolve`` cache is ``functools.lru_cache``, which is thread-safe). The rules are in the
    module docstring.
    """

    days: frozenset[int] = EVERY_DAY
    start: time = time(0, 0)
    end: time = time(23, 59, 59)
    zone: tzinfo = UTC

    def __post_init__(self) -> None:
        if not self.days <= EVERY_DAY:
            raise ValueError("days must be numbers 0-6 (0 = Sunday)")
        for t in (self.start, self.end):
            if t.microsecond or t.tzinfo is not None:
                raise ValueError("start and end must be naive whole-second times")

    @property
    def crosses_midnight(self) -> bool:
        return self.start > self.end

    def opening(self, day: date) -> tuple[datetime, datetime]:
        """The opening that starts on ``day`` as UTC ``[open_at, close_at)``, whether or not
        ``day``'s weekday is one of the days."""
        end_day = day + timedelta(days=1) if self.crosses_midnight else day
        return (
            resolve(day, self.start, self.zone),
            resolve(end_day, self.end, self.zone) + _ONE_SECOND,
        )

    def contains(self, instant: datetime) -> bool:
        """Whether the window is open at ``instant`` (timezone-aware; ValueError if naive)."""
        at = _utc(instant)
        today = at.astimezone(self.zone).date()
        # An opening lasts at most a little over a day, so only openings that started on the
        # two days before can still be running. Tomorrow's is checked for zones whose clock
        # falls back across midnight, where a later instant can read an earlier date.
        for offset in (-2, -1, 0, 1):
            day = today + timedelta(days=offset)
            if weekday_of(day) in self.days:
                open_at, close_at = self.opening(day)
                if open_at <= at < close_at:
                    return True
        return False

    def next_open(self, after: datetime) -> datetime | None:
        """The first instant at or after ``after`` when the window is open, in UTC.

        ``after`` itself (converted to UTC) when the window is open then; None when the day set
        is empty. ``after`` must be timezone-aware (ValueError otherwise).
        """
        if not self.days:
            return None
        at = _utc(after)
        if self.contains(at):
            return at
        today = at.astimezone(self.zone).date()
        # Openings start in date order (resolve is monotonic), and every weekday occurs among
        # the next seven dates, so this always finds one.
        for offset in range(-1, 9):
            day = today + timedelta(days=offset)
            if weekday_of(day) in self.days:
                open_at, _ = self.opening(day)
                if open_at > at:
                    return open_at
        raise AssertionError("unreachable: some listed weekday occurs within a week")

    def describe(self) -> str:
        """A one-line human description, e.g.
        ``Fri, Sat 22:00:00 to 02:00:00 next day (end second included), Europe/London``."""
        zone = str(self.zone)
        if not self.days:
            return f"never (no reboot days), {zone}"
        if self.days == EVERY_DAY:
            days = "every day"
        else:
            days = ", ".join(DAY_NAMES[d] for d in sorted(self.days))
        start, end = self.start.isoformat(), self.end.isoformat()
        if self.start == self.end:
            return f"{days} at {start} for one second, {zone}"
        nxt = " next day" if self.crosses_midnight else ""
        return f"{days} {start} to {end}{nxt} (end second included), {zone}"


def parse_window(
    days: Iterable[str],
    start: str,
    end: str,
    zone: str,
    *,
    local: Callable[[], tzinfo] | None = None,
) -> RebootWindow:
    """A window from kured's flag values (``local`` as for ``parse_zone``). Raises
    ``ConfigurationError`` listing every problem."""
    problems: list[str] = []
    parsed_days: frozenset[int] = frozenset()
    parsed_start = parsed_end = time(0)
    parsed_zone: tzinfo = UTC
    try:
        parsed_days = parse_days(days)
    except ValueError as exc:
        problems.append(f"reboot days: {exc}")
    try:
        parsed_start = parse_time(start)
    except ValueError as exc:
        problems.append(f"start time: {exc}")
    try:
        parsed_end = parse_time(end)
    except ValueError as exc:
        problems.append(f"end time: {exc}")
    try:
        parsed_zone = parse_zone(zone, local=local)
    except ValueError as exc:
        problems.append(f"time zone: {exc}")
    if problems:
        raise ConfigurationError(problems)
    return RebootWindow(parsed_days, parsed_start, parsed_end, parsed_zone)
