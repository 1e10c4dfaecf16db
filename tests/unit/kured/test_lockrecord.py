"""kured's lock record (kured.core.lockrecord): byte compatibility and the acquire/release rules.

Fixtures are written by hand from kured's lock annotation format (kubereboot/kured, pkg/daemonsetlock) and from what Go's
encoding/json and time.Time.MarshalJSON produce; each must round-trip byte for byte. The
property tests check that whatever we write parses back to the same record and re-serialises to
the same bytes, and that the transitions keep the semaphore's invariants.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kured.core import lockrecord as lr
from kured.core.errors import LockError
from kured.locks.base import Holder

HOUR_NS = 3_600_000_000_000
T0 = 1_772_352_764_123_456_789  # 2026-03-01T08:12:44.123456789Z

SINGLE_FIXTURES = [
    # §2.5's single-holder example, verbatim.
    b'{"nodeID":"worker-2","metadata":{"unschedulable":false},"created":"2026-03-01T08:12:44.123456789Z","TTL":0}',
    # Go trims trailing zeros of the fraction, and writes none at all for whole seconds.
    b'{"nodeID":"w1","metadata":{"unschedulable":true},"created":"2026-03-01T08:12:44.1Z","TTL":3600000000000}',
    b'{"nodeID":"w1","metadata":{"unschedulable":false},"created":"2026-03-01T08:12:44Z","TTL":1800000000000}',
    # Go's zero time (a record written by hand without "created").
    b'{"nodeID":"manual","metadata":{"unschedulable":false},"created":"0001-01-01T00:00:00Z","TTL":0}',
    # Go's HTML-safe escaping and non-ASCII kept raw.
    b'{"nodeID":"a\\u003cb\\u003e\\u0026c\\nd\\u0001\xc3\xa9","metadata":{"unschedulable":false},"created":"2026-03-01T08:12:44.000000001Z","TTL":1}',
    # A non-UTC offset survives (Go keeps the parsed zone when it re-marshals).
    b'{"nodeID":"w3","metadata":{"unschedulable":false},"created":"2026-03-01T10:12:44.5+02:00","TTL":0}',
]

MULTI_FIXTURES = [
    # §2.5's multi-holder example with a concrete time.
    b'{"maxOwners":3,"locks":[{"nodeID":"w1","metadata":{"unschedulable":false},"created":"2026-03-01T08:12:44.123456789Z","TTL":0}]}',
    b'{"maxOwners":3,"locks":[{"nodeID":"w1","metadata":{"unschedulable":false},"created":"2026-03-01T08:12:44.123456789Z","TTL":0},{"nodeID":"w2","metadata":{"unschedulable":true},"created":"2026-03-01T08:13:01.5Z","TTL":3600000000000}]}',
    # What the annotation stays as after the last holder released.
    b'{"maxOwners":3,"locks":[]}',
]


@pytest.mark.parametrize("raw", SINGLE_FIXTURES + MULTI_FIXTURES)
def test_kured_written_records_round_trip_byte_for_byte(raw: bytes) -> None:
    assert lr.serialise(lr.parse(raw)) == raw


def test_single_example_parses_to_its_fields() -> None:
    record = lr.parse(SINGLE_FIXTURES[0])
    assert not record.multi
    (entry,) = record.entries
    assert entry.node_id == "worker-2"
    assert entry.unschedulable is False
    assert entry.created_ns == T0
    assert entry.created_raw == "2026-03-01T08:12:44.123456789Z"
    assert entry.ttl_ns == 0


def test_multi_example_parses_to_its_fields() -> None:
    record = lr.parse(MULTI_FIXTURES[1])
    assert record.multi
    assert record.max_owners == 3
    assert [e.node_id for e in record.entries] == ["w1", "w2"]
    assert record.entries[1].ttl_ns == HOUR_NS
    assert record.entries[1].unschedulable is True


def test_holder_keeps_the_raw_nanosecond_text_and_a_microsecond_datetime() -> None:
    holder = Holder.from_entry(lr.parse(SINGLE_FIXTURES[1]).entries[0])
    assert holder.node_id == "w1"
    assert holder.created_raw == "2026-03-01T08:12:44.1Z"
    assert holder.created_at == datetime(2026, 3, 1, 8, 12, 44, 100000, tzinfo=UTC)
    assert holder.ttl_seconds == 3600.0
    assert holder.unschedulable is True


def test_go_zero_time_is_accepted_and_becomes_datetime_min() -> None:
    entry = lr.parse(b'{"nodeID":"manual"}').entries[0]
    assert entry.created_ns == lr.GO_ZERO_TIME_NS
    assert entry.created_raw == lr.GO_ZERO_TIME
    assert Holder.from_entry(entry).created_at == datetime(1, 1, 1, tzinfo=UTC)


def test_missing_fields_take_gos_zero_values_and_are_written_in_full() -> None:
    # kured's documented pause: {"nodeID":"manual"} - never expires.
    record = lr.parse(b'{"nodeID":"manual"}')
    assert lr.serialise(record) == SINGLE_FIXTURES[3]
    assert not record.entries[0].expired(T0)


def test_keys_match_case_insensitively_and_unknown_keys_are_ignored() -> None:
    record = lr.parse(b'{"NODEID":"w1","ttl":5,"extra":[1,2],"Metadata":{"UnSchedulable":true}}')
    entry = record.entries[0]
    assert (entry.node_id, entry.ttl_ns, entry.unschedulable) == ("w1", 5, True)


def test_null_values_leave_zero_values_like_go() -> None:
    record = lr.parse(b'{"nodeID":null,"metadata":null,"created":null,"TTL":null}')
    assert lr.serialise(record) == (
        b'{"nodeID":"","metadata":{"unschedulable":false},"created":"0001-01-01T00:00:00Z","TTL":0}'
    )


def test_created_is_rewritten_as_go_would_marshal_it() -> None:
    # Go parses then re-marshals: trailing zeros trimmed, >9 digits truncated, +00:00 → Z.
    for given_text, written in [
        ("2026-03-01T08:12:44.120000Z", "2026-03-01T08:12:44.12Z"),
        ("2026-03-01T08:12:44.1234567891234Z", "2026-03-01T08:12:44.123456789Z"),
        ("2026-03-01T08:12:44+00:00", "2026-03-01T08:12:44Z"),
        ("2026-03-01T08:12:44.000Z", "2026-03-01T08:12:44Z"),
    ]:
        raw = json.dumps({"nodeID": "n", "created": given_text}).encode()
        entry = lr.parse(raw).entries[0]
        assert entry.created_raw == given_text
        assert entry.created_text == written


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b"[]",
        b'"a string"',
        b'{"nodeID":1}',
        b'{"nodeID":"n","TTL":1.5}',
        b'{"nodeID":"n","TTL":"1h"}',
        b'{"nodeID":"n","TTL":true}',
        b'{"nodeID":"n","TTL":9223372036854775808}',
        b'{"nodeID":"n","TTL":NaN}',
        b'{"nodeID":"n","created":"yesterday"}',
        b'{"nodeID":"n","created":"2026-02-30T00:00:00Z"}',
        b'{"nodeID":"n","created":"2026-03-01T24:00:00Z"}',
        b'{"nodeID":"n","created":"2026-03-01T08:12:60Z"}',
        b'{"nodeID":"n","created":"2026-03-01t08:12:44z"}',
        b'{"nodeID":"n","created":"2026-03-01T08:12:44"}',
        b'{"nodeID":"n","created":5}',
        b'{"nodeID":"n","metadata":{"unschedulable":"yes"}}',
        b'{"nodeID":"n","metadata":[]}',
        b'{"maxOwners":2,"locks":{}}',
        b'{"maxOwners":2,"locks":[1]}',
        b'{"maxOwners":"2","locks":[]}',
    ],
)
def test_records_kureds_decoder_refuses_raise_lock_error(raw: bytes) -> None:
    with pytest.raises(LockError):
        lr.parse(raw)


def test_format_is_recognised_from_the_stored_keys() -> None:
    assert lr.parse(b'{"maxOwners":3,"locks":[]}').multi
    assert lr.parse(b'{"locks":null}').multi
    assert not lr.parse(b'{"nodeID":"x"}').multi
    assert not lr.parse(b"{}").multi


# --- transitions ------------------------------------------------------------------------------


def _acquire(
    record: lr.LockRecord | None,
    node: str,
    now_ns: int,
    *,
    ttl_ns: int = 0,
    max_holders: int = 1,
    unschedulable: bool = False,
) -> lr.Outcome:
    return lr.acquire(
        record,
        node,
        unschedulable=unschedulable,
        ttl_ns=ttl_ns,
        now_ns=now_ns,
        max_holders=max_holders,
    )


def test_single_acquire_on_free_lock_writes_kureds_single_format() -> None:
    outcome = _acquire(None, "worker-2", T0)
    assert outcome.held
    assert outcome.write is lr.Write.PUT
    assert outcome.record is not None
    assert lr.serialise(outcome.record) == SINGLE_FIXTURES[0]


def test_multi_acquire_writes_kureds_multi_format() -> None:
    outcome = _acquire(None, "w1", T0, max_holders=3)
    assert outcome.record is not None
    assert lr.serialise(outcome.record) == MULTI_FIXTURES[0]


def test_acquire_held_by_another_node_fails_without_writing() -> None:
    record = _acquire(None, "a", T0).record
    outcome = _acquire(record, "b", T0 + HOUR_NS)
    assert not outcome.held
    assert outcome.write is lr.Write.KEEP
    assert [e.node_id for e in outcome.entries] == ["a"]


def test_reacquire_by_holder_does_not_refresh_created_or_write() -> None:
    record = _acquire(None, "a", T0, ttl_ns=HOUR_NS, unschedulable=True).record
    again = _acquire(record, "a", T0 + HOUR_NS // 2, ttl_ns=2 * HOUR_NS)
    assert again.held
    assert again.write is lr.Write.KEEP
    assert again.record == record  # same created, TTL and unschedulable as first recorded


def test_ttl_zero_never_expires() -> None:
    record = _acquire(None, "a", T0, ttl_ns=0).record
    a_century_later = T0 + 100 * 365 * 24 * HOUR_NS
    assert not _acquire(record, "b", a_century_later).held


def test_expiry_uses_the_records_own_ttl() -> None:
    record = _acquire(None, "a", T0, ttl_ns=HOUR_NS).record
    # b's configured TTL (0) does not matter: a's entry carries its own.
    assert not _acquire(record, "b", T0 + HOUR_NS - 1).held
    taken = _acquire(record, "b", T0 + HOUR_NS)
    assert taken.held
    assert taken.write is lr.Write.PUT
    assert [e.node_id for e in taken.entries] == ["b"]


def test_multi_acquire_prunes_expired_entries_before_counting() -> None:
    record = lr.LockRecord(
        multi=True,
        max_owners=3,
        entries=(
            lr.new_entry("old", False, T0, HOUR_NS),
            lr.new_entry("live", False, T0, 0),
        ),
    )
    # kured appends while the list is short, keeping "old" forever in the count.
    outcome = _acquire(record, "new", T0 + 2 * HOUR_NS, max_holders=3)
    assert [e.node_id for e in outcome.entries] == ["live", "new"]


def test_multi_acquire_never_duplicates_a_node() -> None:
    record = _acquire(None, "a", T0, max_holders=3).record
    outcome = _acquire(record, "a", T0 + 1, max_holders=3)
    assert outcome.write is lr.Write.KEEP
    assert [e.node_id for e in outcome.entries] == ["a"]


def test_multi_acquire_fails_when_every_slot_is_live() -> None:
    record = None
    for node in ("a", "b"):
        record = _acquire(record, node, T0, max_holders=2).record
    outcome = _acquire(record, "c", T0, max_holders=2)
    assert not outcome.held
    assert [e.node_id for e in outcome.entries] == ["a", "b"]


def test_empty_multi_record_is_free_for_a_single_holder_lock() -> None:
    # kured with --concurrency 1 reads it as held by "" forever (Behaviours item 10).
    outcome = _acquire(lr.parse(MULTI_FIXTURES[2]), "a", T0)
    assert outcome.held
    assert outcome.record is not None
    assert not outcome.record.multi


def test_single_record_counts_as_a_holder_for_a_multi_holder_lock() -> None:
    # kured with --concurrency >= 2 treats it as free: the {"nodeID":"manual"} pause is lost.
    manual = lr.parse(b'{"nodeID":"manual"}')
    outcome = _acquire(manual, "a", T0, max_holders=2)
    assert outcome.held
    assert [e.node_id for e in outcome.entries] == ["manual", "a"]
    assert not _acquire(outcome.record, "b", T0, max_holders=2).held


def test_single_release_deletes_and_multi_release_leaves_an_empty_list() -> None:
    single = _acquire(None, "a", T0).record
    assert lr.release(single, "a", max_holders=1).write is lr.Write.DELETE
    multi = _acquire(None, "a", T0, max_holders=3).record
    released = lr.release(multi, "a", max_holders=3)
    assert released.write is lr.Write.PUT
    assert released.record is not None
    assert lr.serialise(released.record) == MULTI_FIXTURES[2]


def test_release_by_a_non_holder_changes_nothing() -> None:
    record = _acquire(None, "a", T0).record
    outcome = lr.release(record, "b", max_holders=1)
    assert outcome.write is lr.Write.KEEP
    assert outcome.record == record
    assert lr.release(None, "b", max_holders=1).write is lr.Write.KEEP


def test_release_removes_every_entry_of_the_node_even_expired_ones() -> None:
    entries = (
        lr.new_entry("a", False, T0, 1),
        lr.new_entry("b", False, T0, 0),
        lr.new_entry("a", False, T0, 0),
    )
    outcome = lr.release(lr.LockRecord(True, entries, 3), "a", max_holders=3)
    assert [e.node_id for e in outcome.entries] == ["b"]


def test_lowering_concurrency_keeps_every_remaining_holder() -> None:
    record = None
    for node in ("a", "b", "c"):
        record = _acquire(record, node, T0, max_holders=3).record
    # Now concurrency 1: a release must not squeeze two holders into the single format.
    outcome = lr.release(record, "a", max_holders=1)
    assert outcome.record is not None
    assert outcome.record.multi
    assert [e.node_id for e in outcome.entries] == ["b", "c"]
    assert not _acquire(outcome.record, "d", T0, max_holders=1).held


# --- properties -------------------------------------------------------------------------------

# Any Python text (incl. lone surrogates, which Go turns into U+FFFD), biased to the escapes.
NODE_IDS = st.text(
    alphabet=st.one_of(
        st.sampled_from('<>&"\\\b\f\n\r\t\x00\x1f\x7f\u2028\u2029é☃'), st.characters()
    ),
    max_size=20,
)
YEAR_1_NS = lr.GO_ZERO_TIME_NS
YEAR_9999_END_NS = 253_402_300_799 * 1_000_000_000 + 999_999_999
DAY_NS = 24 * HOUR_NS
# A day's margin so that any offset keeps the local date inside Go's years 0000-9999.
CREATED_NS = st.integers(min_value=YEAR_1_NS, max_value=YEAR_9999_END_NS - DAY_NS)
OFFSETS = st.sampled_from([0, 0, 3600, -3600, 19800, -34200, 23 * 3600 + 59 * 60])
ENTRIES = st.builds(
    lr.LockEntry,
    node_id=NODE_IDS,
    unschedulable=st.booleans(),
    created_ns=CREATED_NS,
    ttl_ns=st.integers(min_value=lr.INT64_MIN, max_value=lr.INT64_MAX),
    created_offset_seconds=OFFSETS,
)


def _go_string(value: str) -> str:
    return "".join("\ufffd" if "\ud800" <= c <= "\udfff" else c for c in value)


@st.composite
def records(draw: st.DrawFn) -> lr.LockRecord:
    if draw(st.booleans()):
        return lr.LockRecord(multi=False, entries=(draw(ENTRIES),))
    entries = tuple(draw(st.lists(ENTRIES, max_size=5)))
    return lr.LockRecord(multi=True, entries=entries, max_owners=draw(st.integers(0, 100)))


@settings(max_examples=300)
@given(records())
def test_serialised_records_parse_back_and_reserialise_identically(record: lr.LockRecord) -> None:
    raw = lr.serialise(record)
    parsed = lr.parse(raw)
    expected = lr.LockRecord(
        multi=record.multi,
        max_owners=record.max_owners,
        entries=tuple(
            lr.LockEntry(
                _go_string(e.node_id),
                e.unschedulable,
                e.created_ns,
                e.ttl_ns,
                e.created_offset_seconds,
            )
            for e in record.entries
        ),
    )
    assert parsed == expected
    assert lr.serialise(parsed) == raw
    # The bytes are plain JSON any decoder reads, with kured's keys in kured's order.
    expected_keys = (
        ["maxOwners", "locks"] if record.multi else ["nodeID", "metadata", "created", "TTL"]
    )
    assert list(json.loads(raw)) == expected_keys


@given(CREATED_NS, OFFSETS)
def test_created_text_parses_back_to_the_same_instant(created_ns: int, offset: int) -> None:
    text = lr.format_created(created_ns, offset)
    assert lr.parse_created(text) == (created_ns, offset)


@given(st.integers(min_value=0, max_value=YEAR_9999_END_NS))
def test_created_text_agrees_with_python_to_the_microsecond(created_ns: int) -> None:
    text = lr.format_created(created_ns)
    seconds, nanos = divmod(created_ns, 1_000_000_000)
    expected = datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    assert text.startswith(expected)
    assert text.endswith("Z")
    fraction = text[len(expected) : -1]
    assert fraction == ("." + f"{nanos:09d}".rstrip("0") if nanos else "")


@given(NODE_IDS)
def test_go_json_strings_decode_to_the_go_string(value: str) -> None:
    encoded = lr.go_json_string(value)
    assert json.loads(encoded) == _go_string(value)
    assert not any(c in encoded for c in "<>&\u2028\u2029")


OPS = st.lists(
    st.tuples(
        st.sampled_from(["acquire", "release"]),
        st.sampled_from(["a", "b", "c", "d", "e"]),
        st.integers(min_value=0, max_value=3 * HOUR_NS),  # time step
        st.sampled_from([0, HOUR_NS]),  # ttl
    ),
    max_size=40,
)


@settings(max_examples=300)
@given(OPS, st.integers(min_value=1, max_value=4))
def test_transitions_never_admit_more_live_holders_than_slots(
    ops: list[tuple[str, str, int, int]], max_holders: int
) -> None:
    record: lr.LockRecord | None = None
    now = T0
    for op, node, step, ttl in ops:
        now += step
        if op == "acquire":
            outcome = _acquire(record, node, now, ttl_ns=ttl, max_holders=max_holders)
        else:
            outcome = lr.release(record, node, max_holders=max_holders)
        if outcome.write is not lr.Write.KEEP:
            record = outcome.record
            if record is not None:  # what we write must read back the same
                assert lr.parse(lr.serialise(record)) == record
        live = [e.node_id for e in outcome.entries if not e.expired(now)]
        assert len(live) <= max_holders
        assert len(live) == len(set(live))
        assert outcome.held == lr.holding(record, node, now)
