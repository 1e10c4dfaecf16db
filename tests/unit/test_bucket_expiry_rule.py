"""The bucket-side expiry rule (``core.bucket_expiry``) and the touch-marker layout."""

from __future__ import annotations

from kura.core.bucket_expiry import (
    Victim,
    bucket_cutoff_ms,
    last_use_ms,
    marker_refresh_ms,
    select_expired,
)
from kura.core.object_layout import (
    is_object_key,
    marker_object_key,
    namespace_prefix,
    object_key,
    touch_key,
)

NOW = 1_800_000_000_000
AGE = 40.0  # seconds
CUT = bucket_cutoff_ms(NOW, AGE)


def test_the_cutoff_leaves_the_marker_refresh_as_slack() -> None:
    assert marker_refresh_ms(AGE) == 10_000
    assert CUT == NOW - 40_000 - 10_000
    assert marker_refresh_ms(0.001) == 1  # never 0: a marker is not rewritten on every read


def test_last_use_is_the_later_of_object_and_marker() -> None:
    assert last_use_ms(5, None) == 5
    assert last_use_ms(5, 9) == 9
    assert last_use_ms(9, 5) == 9


def test_an_object_older_than_the_cutoff_without_a_marker_is_selected() -> None:
    key = object_key("t", "n", "a1")
    assert select_expired({key: CUT - 1}, {}, CUT, set()) == [Victim(key, None, CUT - 1)]


def test_an_object_at_or_after_the_cutoff_is_never_selected() -> None:
    objects = {object_key("t", "n", "a1"): CUT, object_key("t", "n", "a2"): NOW}
    assert select_expired(objects, {}, CUT, set()) == []


def test_a_recent_marker_keeps_an_old_object() -> None:
    key = object_key("t", "n", "a1")
    markers = {key: (touch_key("t", "n", "a1"), CUT + 1)}
    assert select_expired({key: CUT - 100_000}, markers, CUT, set()) == []


def test_an_old_marker_goes_with_its_old_object() -> None:
    key, marker = object_key("t", "n", "a1"), touch_key("t", "n", "a1")
    got = select_expired({key: CUT - 100}, {key: (marker, CUT - 10)}, CUT, set())
    assert got == [Victim(key, marker, CUT - 10)]


def test_an_object_whose_upload_is_pending_here_is_never_selected() -> None:
    objects = {object_key("t", "n", "a1"): CUT - 100, object_key("t", "n", "a2"): CUT - 100}
    got = select_expired(objects, {}, CUT, {"a1"})
    assert [v.object_key for v in got] == [object_key("t", "n", "a2")]


def test_a_marker_without_its_object_is_selected_only_once_old() -> None:
    markers = {
        object_key("t", "n", "gone1"): (touch_key("t", "n", "gone1"), CUT - 1),
        object_key("t", "n", "gone2"): (touch_key("t", "n", "gone2"), CUT + 1),
    }
    got = select_expired({}, markers, CUT, set())
    assert got == [Victim(None, touch_key("t", "n", "gone1"), CUT - 1)]


def test_victims_come_oldest_use_first() -> None:
    objects = {object_key("t", "n", f"a{i}"): CUT - 1000 + i * 7 % 5 for i in range(10)}
    got = select_expired(objects, {}, CUT, set())
    assert len(got) == 10
    assert [v.last_use_ms for v in got] == sorted(v.last_use_ms for v in got)


def test_empty_inputs_select_nothing() -> None:
    assert select_expired({}, {}, CUT, set()) == []


def test_markers_live_outside_every_namespace_prefix_and_map_back_to_their_object() -> None:
    for namespace in ("", "n", "team-a"):
        marker = touch_key("t", namespace, "abc")
        assert not marker.startswith(namespace_prefix("t", namespace))
        assert marker_object_key("t", marker) == object_key("t", namespace, "abc")
        assert is_object_key("t", object_key("t", namespace, "abc"))
        assert not is_object_key("t", marker)
    assert marker_object_key("t", object_key("t", "n", "abc")) is None
    assert not is_object_key("t", "t/ns-n")  # a namespace segment alone is no object
