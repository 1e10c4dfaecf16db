"""kured's lock record: the JSON kured keeps in its lock annotation, and the rules that change it.

Owns parsing and serialising the two formats kured writes (docs/reference/kured-behaviour.md
§2.5), byte for byte as Go's ``encoding/json`` writes them, and the pure acquire/release
transitions every record-based ``Lock`` (etcd now, the Kubernetes annotation next) applies
between its read and its compare-and-swap write.

Single format (``--concurrency`` ≤ 1)::

    {"nodeID":"w2","metadata":{"unschedulable":false},"created":"2026-03-01T08:12:44.123456789Z","TTL":0}

Multi format (``--concurrency`` ≥ 2)::

    {"maxOwners":3,"locks":[<single>,...]}

Wire rules reproduced from Go (kured marshals ``LockAnnotationValue`` with ``json.Marshal``):

* key order and spelling as above, no spaces; ``metadata`` is always written (``omitempty`` has
  no effect on a struct in Go);
* ``created`` is ``time.Time``'s JSON form: RFC 3339 with nanoseconds, trailing zeros of the
  fraction trimmed (``.5Z``, or no fraction at all when it is zero), ``Z`` whenever the offset is
  zero and ``±hh:mm`` otherwise. kured writes UTC. Go's zero time ``0001-01-01T00:00:00Z`` is
  what a record without ``created`` means;
* ``TTL`` is a ``time.Duration``: an integer count of nanoseconds (1 h = ``3600000000000``);
* strings are escaped like Go (``<``, ``>``, ``&``, U+2028 and U+2029 as ``\\u00XX``/``\\u20XX``,
  control characters as ``\\n``-style or lowercase ``\\u00XX`` escapes, other text raw UTF-8).

Reading follows Go's decoder: keys match case-insensitively, unknown keys are ignored, ``null``
leaves the zero value, a fractional or out-of-range ``TTL`` is an error, ``created`` must be
RFC 3339 (more than nine fraction digits are truncated). Anything else that is not kured's shape
raises ``LockError``; a lock store that cannot be read fails closed (no node acquires).

Where we deliberately differ from kured's algorithms (each covered by a unit test):

* Multi-acquire prunes expired entries *before* counting, and a node already holding an
  unexpired entry is never appended a second time (kured appends without pruning or checking
  for duplicates while the list is short).
* The format is recognised from the stored JSON, not assumed from the local ``--concurrency``
  (Behaviours item 10): an empty multi record ``{"maxOwners":N,"locks":[]}`` read with
  concurrency 1 is a free lock (kured: held by ``""`` forever), and a single record read with
  concurrency ≥ 2 is one holder (kured: free, so the documented ``{"nodeID":"manual"}`` pause
  is silently overwritten). A single record without ``nodeID`` still counts as held by ``""``
  and never expires: an unknown holder blocks, as in kured.
* Release removes every entry of the node (kured: the first) and releasing a lock the node does
  not hold changes nothing instead of being an error.

Kept from kured: expiry uses each entry's own TTL (0 = never, kured#822), measured against the
caller's clock; re-acquiring your own unexpired entry does not refresh ``created``; a single
release deletes the record, a multi release leaves ``"locks":[]``; release ignores expiry.

Everything here is pure and safe to call from any thread; times are integer nanoseconds since
the Unix epoch (UTC).
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kured.core.errors import LockError

NANOS_PER_SECOND = 1_000_000_000
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

# Go's zero time.Time; kured's decoder leaves it in a record that has no "created".
GO_ZERO_TIME = "0001-01-01T00:00:00Z"
_DAYS_0001_TO_1970 = 719_162
GO_ZERO_TIME_NS = -_DAYS_0001_TO_1970 * 86_400 * NANOS_PER_SECOND

# RFC 3339 as Go's time.Time.UnmarshalJSON accepts it: upper-case T and Z, optional fraction of
# any length (truncated to nanoseconds), offset Z or ±hh:mm.
_RFC3339 = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?(?:(Z)|([+-])(\d{2}):(\d{2}))\Z",
    re.ASCII,
)


class Write(enum.Enum):
    """What a transition asks the store to do with the key."""

    KEEP = "keep"  # nothing changed: no write (and so no compare-and-swap)
    PUT = "put"  # store ``Outcome.record``
    DELETE = "delete"  # remove the key (kured's single-format release)


@dataclass(frozen=True)
class LockEntry:
    """One holder as kured stores it, exactly.

    ``created_ns`` is nanoseconds since the Unix epoch (UTC); ``created_offset_seconds`` the
    UTC offset the text was written in (kured writes 0); ``ttl_ns`` nanoseconds, 0 = never
    expires. ``created_raw`` is the text as read (for display); it is not compared.
    """

    node_id: str
    unschedulable: bool
    created_ns: int
    ttl_ns: int
    created_offset_seconds: int = 0
    created_raw: str = field(default="", compare=False)

    @property
    def created_text(self) -> str:
        """``created`` as Go would marshal this instant (what we write)."""
        return format_created(self.created_ns, self.created_offset_seconds)

    def expired(self, now_ns: int) -> bool:
        """kured's ttlExpired with the entry's own TTL: ``TTL > 0 and now - created >= TTL``."""
        return self.ttl_ns > 0 and now_ns - self.created_ns >= self.ttl_ns


@dataclass(frozen=True)
class LockRecord:
    """A parsed lock value. ``multi`` selects the format; ``max_owners`` is the stored
    ``maxOwners`` (informational: kured ignores it on read, so do we); ``entries`` in stored
    order. A single-format record always has exactly one entry."""

    multi: bool
    entries: tuple[LockEntry, ...]
    max_owners: int = 0


@dataclass(frozen=True)
class Outcome:
    """The result of a transition. ``held``: the node holds a slot afterwards. ``record``: the
    state afterwards (None = no key). ``write`` says how to get there from what was read."""

    held: bool
    write: Write
    record: LockRecord | None

    @property
    def entries(self) -> tuple[LockEntry, ...]:
        return self.record.entries if self.record is not None else ()


# A rule applied between a lock's read and its compare-and-swap write (acquire, release bound
# to their arguments); it reads the clock itself so every retry sees a fresh ``now``.
Transition = Callable[[LockRecord | None], Outcome]


# --- time ---------------------------------------------------------------------------------


def _days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (any year, incl. 0)."""
    year -= month <= 2
    era = year // 400
    yoe = year - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146_097 + doe - 719_468


def _civil_from_days(days: int) -> tuple[int, int, int]:
    days += 719_468
    era = days // 146_097
    doe = days - era * 146_097
    yoe = (doe - doe // 1460 + doe // 36_524 - doe // 146_096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = mp + (3 if mp < 10 else -9)
    return yoe + era * 400 + (month <= 2), month, day


def _days_in_month(year: int, month: int) -> int:
    if month == 2:
        leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
        return 29 if leap else 28
    return 30 if month in (4, 6, 9, 11) else 31


def parse_created(text: str) -> tuple[int, int]:
    """Parse ``created`` as Go's ``time.Time`` JSON decoder does.

    Returns ``(nanoseconds since the epoch, UTC offset in seconds)``. Raises ``LockError`` for
    anything that is not RFC 3339 (Go's strict form: four-digit year, ``T``, ``Z`` or
    ``±hh:mm`` with hours < 24, a real calendar date, seconds < 60).
    """
    m = _RFC3339.match(text)
    if m is None:
        raise LockError(f"lock record: created {text!r} is not RFC 3339")
    year, month, day, hour, minute, second = (int(g) for g in m.group(1, 2, 3, 4, 5, 6))
    fraction = m.group(7) or ""
    if not (1 <= month <= 12 and 1 <= day <= _days_in_month(year, month)):
        raise LockError(f"lock record: created {text!r} is not a calendar date")
    if hour > 23 or minute > 59 or second > 59:
        raise LockError(f"lock record: created {text!r} has an out-of-range time of day")
    offset = 0
    if m.group(8) is None:
        off_h, off_m = int(m.group(10)), int(m.group(11))
        if off_h > 23 or off_m > 59:
            raise LockError(f"lock record: created {text!r} has an out-of-range offset")
        offset = (off_h * 3600 + off_m * 60) * (-1 if m.group(9) == "-" else 1)
    nanos = int((fraction[:9]).ljust(9, "0")) if fraction else 0
    local_seconds = _days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60
    return (local_seconds + second - offset) * NANOS_PER_SECOND + nanos, offset


def format_created(created_ns: int, offset_seconds: int = 0) -> str:
    """``created`` as Go's ``time.Time.MarshalJSON`` writes it (RFC 3339, nanoseconds with
    trailing zeros trimmed, ``Z`` for a zero offset). Raises ``LockError`` outside years
    0000-9999, which Go refuses to marshal."""
    seconds, nanos = divmod(created_ns, NANOS_PER_SECOND)
    days, day_seconds = divmod(seconds + offset_seconds, 86_400)
    year, month, day = _civil_from_days(days)
    if not 0 <= year <= 9999:
        raise LockError(f"lock record: created year {year} is outside 0000-9999")
    hour, rest = divmod(day_seconds, 3600)
    minute, second = divmod(rest, 60)
    text = f"{year:04d}-{month:02d}-{day:02d}T{hour:02d}:{minute:02d}:{second:02d}"
    if nanos:
        text += "." + f"{nanos:09d}".rstrip("0")
    if offset_seconds == 0:
        return text + "Z"
    sign = "-" if offset_seconds < 0 else "+"
    off_h, off_m = divmod(abs(offset_seconds) // 60, 60)
    return f"{text}{sign}{off_h:02d}:{off_m:02d}"


# --- Go's JSON string encoding ---------------------------------------------------------------

_GO_SHORT_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
}
_GO_ESCAPED = re.compile('["\\\\\x00-\x1f<>&\u2028\u2029\ud800-\udfff]')
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _go_escape(match: re.Match[str]) -> str:
    char = match.group()
    short = _GO_SHORT_ESCAPES.get(char)
    if short is not None:
        return short
    if "\ud800" <= char <= "\udfff":
        return "\ufffd"  # Go strings cannot hold a lone surrogate; its encoder writes U+FFFD
    return f"\\u{ord(char):04x}"


def go_json_string(value: str) -> str:
    """``value`` as Go's ``encoding/json`` writes a string (HTML-safe escaping on, Go ≥ 1.22
    short escapes for ``\\b`` and ``\\f``)."""
    return '"' + _GO_ESCAPED.sub(_go_escape, value) + '"'


# --- parsing ----------------------------------------------------------------------------------


class _Pairs(list[tuple[str, Any]]):
    """A JSON object kept as its ordered key/value pairs (duplicates included)."""


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _fields(obj: list[tuple[str, Any]], names: Sequence[str]) -> dict[str, Any]:
    """Go's struct decoding: each key matches a field exactly or case-insensitively; later keys
    overwrite earlier ones; unknown keys are ignored."""
    folded = {name.casefold(): name for name in names}
    out: dict[str, Any] = {}
    for key, value in obj:
        name = key if key in names else folded.get(key.casefold())
        if name is not None:
            out[name] = value
    return out


def _as_pairs(value: Any, what: str) -> list[tuple[str, Any]] | None:
    if value is None:
        return None
    if not isinstance(value, _Pairs):
        raise LockError(f"lock record: {what} is not a JSON object")
    return value


def _string(value: Any, what: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise LockError(f"lock record: {what} is not a string")
    return _LONE_SURROGATE.sub("\ufffd", value)


def _int64(value: Any, what: str) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise LockError(f"lock record: {what} is not an integer")
    if not INT64_MIN <= value <= INT64_MAX:
        raise LockError(f"lock record: {what} is out of range")
    return value


def _entry(obj: list[tuple[str, Any]] | None) -> LockEntry:
    fields = _fields(obj or [], ("nodeID", "metadata", "created", "TTL"))
    metadata = _fields(_as_pairs(fields.get("metadata"), "metadata") or [], ("unschedulable",))
    unschedulable = metadata.get("unschedulable")
    if unschedulable is None:
        unschedulable = False
    elif not isinstance(unschedulable, bool):
        raise LockError("lock record: metadata.unschedulable is not a boolean")
    created_raw = fields.get("created")
    if created_raw is None:
        created_raw = GO_ZERO_TIME
    elif not isinstance(created_raw, str):
        raise LockError("lock record: created is not a string")
    created_ns, offset = parse_created(created_raw)
    return LockEntry(
        node_id=_string(fields.get("nodeID"), "nodeID"),
        unschedulable=unschedulable,
        created_ns=created_ns,
        ttl_ns=_int64(fields.get("TTL"), "TTL"),
        created_offset_seconds=offset,
        created_raw=created_raw,
    )


def _is_multi(obj: list[tuple[str, Any]]) -> bool:
    return any(key.casefold() in ("maxowners", "locks") for key, _ in obj)


def parse(data: bytes | str) -> LockRecord:
    """Parse a stored lock value in either format (recognised by its keys, see the module
    docstring). Invalid UTF-8 is replaced as Go does. Raises ``LockError`` for anything kured's
    decoder would refuse and for a top level that is not an object."""
    text = data.decode("utf-8", errors="replace") if isinstance(data, bytes) else data
    try:
        value = json.loads(text, object_pairs_hook=_Pairs, parse_constant=_reject_constant)
    except ValueError as exc:  # JSONDecodeError is a ValueError
        raise LockError(f"lock record is not JSON: {exc}") from exc
    obj = _as_pairs(value, "the lock record") or _Pairs()
    if not _is_multi(obj):
        return LockRecord(multi=False, entries=(_entry(obj),))
    fields = _fields(obj, ("maxOwners", "locks"))
    locks = fields.get("locks")
    if locks is None:
        locks = []
    elif not isinstance(locks, list) or isinstance(locks, _Pairs):
        raise LockError("lock record: locks is not a JSON array")
    entries = tuple(_entry(_as_pairs(item, "a locks entry")) for item in locks)
    max_owners = _int64(fields.get("maxOwners"), "maxOwners")
    return LockRecord(multi=True, entries=entries, max_owners=max_owners)


# --- serialising --------------------------------------------------------------------------------


def _entry_json(entry: LockEntry) -> str:
    unschedulable = "true" if entry.unschedulable else "false"
    return (
        f'{{"nodeID":{go_json_string(entry.node_id)},'
        f'"metadata":{{"unschedulable":{unschedulable}}},'
        f'"created":{go_json_string(entry.created_text)},'
        f'"TTL":{entry.ttl_ns}}}'
    )


def serialise(record: LockRecord) -> bytes:
    """The bytes kured would write for ``record`` (UTF-8). A single-format record must have
    exactly one entry; ``ValueError`` otherwise (a programming error, not bad data)."""
    if not record.multi:
        if len(record.entries) != 1:
            raise ValueError("a single-format lock record holds exactly one entry")
        return _entry_json(record.entries[0]).encode()
    locks = ",".join(_entry_json(entry) for entry in record.entries)
    return f'{{"maxOwners":{record.max_owners},"locks":[{locks}]}}'.encode()


# --- transitions --------------------------------------------------------------------------------


def new_entry(node_id: str, unschedulable: bool, now_ns: int, ttl_ns: int) -> LockEntry:
    """A fresh entry created now, in UTC (kured: ``time.Now().UTC()``)."""
    return LockEntry(
        node_id=node_id,
        unschedulable=unschedulable,
        created_ns=now_ns,
        ttl_ns=ttl_ns,
        created_raw=format_created(now_ns),
    )


def _record_for(entries: Sequence[LockEntry], max_holders: int) -> LockRecord:
    """The record to store for ``entries`` under the local concurrency: the single format when
    the lock is single-holder and one entry remains, the multi format otherwise (including a
    single-holder lock left with several entries after concurrency was lowered, so none is
    lost)."""
    if max_holders <= 1 and len(entries) == 1:
        return LockRecord(multi=False, entries=(entries[0],))
    return LockRecord(multi=True, entries=tuple(entries), max_owners=max_holders)


def acquire(
    record: LockRecord | None,
    node_id: str,
    *,
    unschedulable: bool,
    ttl_ns: int,
    now_ns: int,
    max_holders: int,
) -> Outcome:
    """Take a slot for ``node_id`` in ``record`` (None = no key) admitting ``max_holders``.

    * ``node_id`` already has an unexpired entry → held, ``KEEP`` (``created``, TTL and
      ``unschedulable`` stay as first recorded);
    * otherwise expired entries are pruned; if fewer than ``max_holders`` remain, a new entry is
      appended → held, ``PUT``;
    * otherwise → not held, ``KEEP``; ``Outcome.entries`` shows who holds the lock (expired
      entries included, as stored).
    """
    if max_holders < 1:
        raise ValueError("max_holders must be at least 1")
    entries = record.entries if record is not None else ()
    live = [entry for entry in entries if not entry.expired(now_ns)]
    if any(entry.node_id == node_id for entry in live):
        return Outcome(held=True, write=Write.KEEP, record=record)
    if len(live) >= max_holders:
        return Outcome(held=False, write=Write.KEEP, record=record)
    live.append(new_entry(node_id, unschedulable, now_ns, ttl_ns))
    return Outcome(held=True, write=Write.PUT, record=_record_for(live, max_holders))


def release(record: LockRecord | None, node_id: str, *, max_holders: int) -> Outcome:
    """Remove every entry of ``node_id`` (expired or not). Not held → ``KEEP`` (no error). The
    last entry of a single-holder lock deletes the key (kured's single release); a
    multi-holder lock keeps ``{"maxOwners":N,"locks":[]}`` (kured's multi release). Other
    entries, expired ones included, are left as they are."""
    if record is None:
        return Outcome(held=False, write=Write.KEEP, record=None)
    remaining = [entry for entry in record.entries if entry.node_id != node_id]
    if len(remaining) == len(record.entries):
        return Outcome(held=False, write=Write.KEEP, record=record)
    if not remaining and max_holders <= 1:
        return Outcome(held=False, write=Write.DELETE, record=None)
    return Outcome(held=False, write=Write.PUT, record=_record_for(remaining, max_holders))


def holding(record: LockRecord | None, node_id: str, now_ns: int) -> bool:
    """kured's Holding: ``node_id`` has an unexpired entry."""
    return record is not None and any(
        entry.node_id == node_id and not entry.expired(now_ns) for entry in record.entries
    )
