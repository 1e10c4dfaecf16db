"""A cron-style reboot window: a cron expression for when each opening starts, and a duration.

kured's own window is days plus a start and an end time (``kured.core.window``). Users ask for
windows such as "the first Sunday of the month, 03:00 to 05:00" (kured #891, #452), which days
cannot say. This window is ``--window-cron`` (when an opening starts) plus
``--window-duration`` (how long each opening lasts) in ``--time-zone``: a cron expression
alone names instants, not a stretch of time (kured #891: "a single timestamp, described as a
cron would not be enough"), so the duration is required.

The expression: five fields, ``minute hour day-of-month month day-of-week``, as cron(5)
(Vixie/Debian cron) reads them: numbers, ``*``, ranges ``a-b``, steps ``*/n`` and ``a-b/n``,
lists, month and day names (``jan``, ``sun``; 0 or 7 = Sunday), plus three common extensions:
``sun#1`` (the first Sunday of the month, ``#1``-``#5``), ``5L`` (the last Friday) and ``L`` /
``LW`` as the day of month (the last day, the last weekday). "First Sunday of the month
03:00-05:00" is ``--window-cron '0 3 * * sun#1' --window-duration 2h``.

**Day-of-month together with day-of-week is refused.** cron(5) runs a line whose two day
fields are both restricted when *either* matches: ``0 3 1-7 * sun`` is days 1-7 *and* every
Sunday, not the first Sunday. That trap is common (it is the usual first try at "the first
Sunday") and, for a reboot window, errs towards rebooting far more often than meant. Reading it
the other way (AND, as some schedulers do) would differ from every crontab the expression may
be copied from. So an expression in which neither day field is ``*`` (nor starts with ``*``,
where cron(5) itself combines them with AND) is refused, naming ``sun#1``. A sixth (seconds)
field is refused too: windows have minute starts.

Evaluation, OUR rules, the same as ``kured.core.window``'s. The library (cronsim) only
enumerates the matching **wall-clock** readings ``(date, hh:mm)``: it is handed naive
datetimes, so its own DST handling (Debian cron's) never runs. Each matching reading W starts
one opening, the half-open interval of instants

    [ resolve(W),  resolve(W) + duration )

where ``resolve`` is ``kured.core.window.resolve``: the earliest instant at which the clock
in the zone reads W or later. So a start in a spring-forward gap opens at the jump; a start
in a repeated (fall-back) hour opens at its first occurrence; a date the zone skipped entirely
(Pacific/Apia, 2011-12-30) still has its openings, at the jump (several readings may then
resolve to the same instant: the same opening).

The duration is **elapsed time**, not a wall-clock end: a 2h window is two real hours on a DST
change day too. The duration is a budget for draining and rebooting nodes, which take real
time; a wall-clock end would give a window over a fall-back change an extra hour and one over a
spring-forward change an hour less (or nothing), and would need its own rule for an end that
does not exist. Unlike ``--end-time`` (whose end second is included), the end is exclusive:
``0 3 * * *`` for ``2h`` is open from 03:00:00 until just before 05:00:00.

Openings may overlap (``*/30 * * * *`` for ``1h``); the window is then open through their union.
``contains(t)`` compares instants in UTC, never wall readings. An expression that never
matches (``0 3 30 2 *``, the 30th of February) is refused when parsed rather than reported as a
window that never opens: a typo should stop the agent's start, not silently stop every reboot.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo

from cronsim import CronSim, CronSimError

from kured.core.errors import ConfigurationError
from kured.core.window import parse_zone, resolve

_ONE_SECOND = timedelta(seconds=1)
# cronsim gives up after 50 years without a match; checked once at parse time from here.
_PROBE_FROM = datetime(2000, 1, 1)
_ONE_VALUE_STEP = re.compile(r"^(\w+)-\1/\d+$", re.IGNORECASE)


def _restricted(day_field: str) -> bool:
    """Whether cron(5) counts this day field as restricted (Vixie cron: not starting with ``*``)."""
    return not day_field.startswith("*")


def check_expression(expression: str) -> str:
    """``expression`` normalised (fields separated by one space), or ValueError saying what is
    wrong: not five fields, a field cronsim rejects, both day fields restricted, or no match."""
    fields = expression.split()
    if len(fields) != 5:
        raise ValueError(
            f"{expression!r} is not a cron expression of five fields "
            "(minute hour day-of-month month day-of-week, e.g. '0 3 * * sun#1')"
        )
    if _restricted(fields[2]) and _restricted(fields[4]):
        raise ValueError(
            f"{expression!r} restricts both the day of month ({fields[2]}) and the day of week "
            f"({fields[4]}): cron(5) opens on either, so '0 3 1-7 * sun' would be days 1-7 and "
            "every Sunday. Restrict one of them: the first Sunday of the month is '0 3 * * sun#1'"
        )
    # cronsim 2.8 (the version installed and the oldest allowed) reads a one-value range with a
    # step (``3-3/2``) as ``3/2``: 3 to the end of the field, every 2nd. cron(5), and cronsim
    # 2.9, read it as the range, 3 alone. Handing cronsim the range's value is right for both.
    normal = " ".join(
        ",".join(_ONE_VALUE_STEP.sub(r"\1", term) for term in f.split(",")) for f in fields
    )
    try:
        probe = CronSim(normal, _PROBE_FROM)
    except (CronSimError, ValueError) as exc:
        hint = ""
        if "day-of-month" in str(exc):
            hint = " (a day outside 1-31, or one no listed month has, such as the 30th of February)"
        raise ValueError(f"{expression!r} is not a valid cron expression: {exc}{hint}") from None
    try:
        next(probe)
    except StopIteration:
        raise ValueError(
            f"{expression!r} never matches a date (e.g. the 30th of February)"
        ) from None
    return normal


@dataclass(frozen=True)
class CronWindow:
    """Openings that start at each wall-clock match of ``expression`` in ``zone`` and last
    ``duration`` of elapsed time. Immutable; the rules are in the module docstring."""

    expression: str
    duration: timedelta
    zone: tzinfo = UTC

    def __post_init__(self) -> None:
        object.__setattr__(self, "expression", check_expression(self.expression))
        if self.duration < _ONE_SECOND:
            raise ValueError("the window's duration must be at least one second")

    # -- wall-clock matches (the library) ----------------------------------------------------

    def _after(self, wall: datetime) -> Iterator[datetime]:
        """Matching naive wall readings strictly after ``wall``, ascending."""
        return _until_overflow(CronSim(self.expression, wall.replace(tzinfo=None, microsecond=0)))

    def _at_or_before(self, wall: datetime) -> Iterator[datetime]:
        """Matching naive wall readings at or before ``wall``, descending."""
        # cronsim's reverse iteration yields readings strictly before a whole-second start;
        # matches are whole minutes, so one second past ``wall``'s second includes ``wall``.
        try:
            start = wall.replace(tzinfo=None, microsecond=0) + _ONE_SECOND
        except OverflowError:  # the last second of year 9999: nothing matches after it anyway
            start = wall.replace(tzinfo=None, microsecond=0)
        return _until_overflow(CronSim(self.expression, start, reverse=True))

    def _highest_reading(self, at: datetime) -> datetime:
        """An upper bound, tight outside a repeated hour, of the highest reading the clock has
        shown up to the instant ``at``: its reading at ``at``, or, inside a repeated (fall-back)
        stretch, that reading plus the size of the change (the clock ran up to it before)."""
        local = at.astimezone(self.zone)
        wall = local.replace(tzinfo=None)
        if not local.fold:
            return wall
        first = wall.replace(tzinfo=self.zone, fold=0).utcoffset()
        second = wall.replace(tzinfo=self.zone, fold=1).utcoffset()
        if first is None or second is None:  # pragma: no cover - an aware zone always answers
            return wall
        return wall + max(first - second, timedelta(0))

    def _resolve(self, wall: datetime) -> datetime:
        return resolve(wall.date(), wall.time(), self.zone)

    # -- the Window protocol -----------------------------------------------------------------

    def last_start(self, instant: datetime) -> datetime | None:
        """The latest opening start at or before ``instant`` (UTC), None if there is none in
        cronsim's 50-year horizon."""
        at = _utc(instant)
        # resolve is monotonic in the wall reading: walk down from the highest reading the
        # clock has shown; the first match whose start is not after ``at`` is the latest.
        for wall in self._at_or_before(self._highest_reading(at)):
            start = self._resolve(wall)
            if start <= at:
                return start
        return None

    def contains(self, instant: datetime) -> bool:
        """Whether the window is open at ``instant`` (timezone-aware; ValueError if naive)."""
        at = _utc(instant)
        start = self.last_start(at)
        # Every opening lasts the same: the latest start ends last. (A difference, not an end:
        # an end past year 9999 cannot be a datetime.)
        return start is not None and at - start < self.duration

    def next_open(self, after: datetime) -> datetime | None:
        """The first instant at or after ``after`` when the window is open, in UTC: ``after``
        itself when open then, else the next opening's start (None if none in 50 years)."""
        at = _utc(after)
        if self.contains(at):
            return at
        # Readings up to the highest one shown so far resolve to ``at`` or earlier: skipped.
        for wall in self._after(_wall(at, self.zone)):
            start = self._resolve(wall)
            if start > at:
                return start
        return None

    def openings(self, after: datetime, limit: int) -> Iterator[tuple[datetime, datetime]]:
        """Up to ``limit`` openings ``(open_at, close_at)`` in UTC that start after ``after``,
        in order; an opening that several readings resolve to (a skipped date) is given once."""
        at = _utc(after)
        previous: datetime | None = None
        count = 0
        for wall in self._after(_wall(at, self.zone)):
            start = self._resolve(wall)
            if start <= at or start == previous:
                continue
            previous = start
            try:
                close = start + self.duration
            except OverflowError:  # an opening that ends past year 9999 stays open to its end
                close = datetime.max.replace(tzinfo=UTC)
            yield start, close
            count += 1
            if count >= limit:
                return

    def describe(self) -> str:
        """A one-line description, e.g. ``cron '0 3 * * sun#1' (At 03:00 on the first Sunday
        of the month), each opening 2h, Europe/Berlin``."""
        try:
            explained = f" ({CronSim(self.expression, _PROBE_FROM).explain()})"
        except Exception:  # the wording is decoration: never let it stop the agent or status
            explained = ""
        return (
            f"cron '{self.expression}'{explained}, each opening "
            f"{_duration_text(self.duration)}, {self.zone}"
        )


def _until_overflow(readings: Iterator[datetime]) -> Iterator[datetime]:
    """``readings``, ended where cronsim steps past year 1 or 9999 (``datetime``'s range): it
    raises OverflowError there (``0 3 29 2 *`` from year 9997 on), which means no further match."""
    while True:
        try:
            reading = next(readings)
        except (StopIteration, OverflowError):
            return
        yield reading


def _duration_text(duration: timedelta) -> str:
    rest = int(duration.total_seconds())
    out = ""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, rest = divmod(rest, size)
        out += f"{count}{unit}" if count else ""
    return out or "0s"


def _wall(instant: datetime, zone: tzinfo) -> datetime:
    return instant.astimezone(zone).replace(tzinfo=None, fold=0)


def _utc(instant: datetime) -> datetime:
    if instant.tzinfo is None or instant.utcoffset() is None:
        raise ValueError("a timezone-aware datetime is required")
    return instant.astimezone(UTC)


def parse_cron_window(
    expression: str,
    duration_seconds: float,
    zone: str,
    *,
    local: Callable[[], tzinfo] | None = None,
) -> CronWindow:
    """A window from the flag values (``local`` as for ``parse_zone``). Raises
    ``ConfigurationError`` listing every problem."""
    problems: list[str] = []
    normal = ""
    parsed_zone: tzinfo = UTC
    try:
        normal = check_expression(expression)
    except ValueError as exc:
        problems.append(f"window cron: {exc}")
    if not duration_seconds >= 1:
        problems.append("window duration: must be at least one second (e.g. 2h)")
    try:
        parsed_zone = parse_zone(zone, local=local)
    except ValueError as exc:
        problems.append(f"time zone: {exc}")
    if problems:
        raise ConfigurationError(problems)
    return CronWindow(normal, timedelta(seconds=duration_seconds), parsed_zone)
