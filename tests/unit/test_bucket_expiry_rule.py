"""The bucket-side expiry rule (``core.bucket_expiry``) and the touch-marker layout."""

from __future__ import annotations

from kura.core.bucket_expiry import (
    FORCED,
    QUOTA,
    Victim,
    bucket_cutoff_ms,
    last_use_ms,
    marker_age_seconds,
    marker_refresh_ms,
    retention_in_bucket,
    select_expired,
    select_over_quota,
)
from kura.core.namespace_rule import NO_RULES, NamespaceRule, NamespaceRules
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


# -- quotas in the bucket (select_over_quota) ------------------------------------------------

HOUR_MS = 3_600_000
REFRESH = 60_000
SIZE = 100  # bytes of every object below


def bucket(spec: dict[str, list[int]]) -> tuple[dict[str, int], dict[str, int]]:
    """namespace -> last-modified ms of its objects ``a0``, ``a1``, ...: (objects, sizes)."""
    objects = {
        object_key("t", namespace, f"a{i}"): ms
        for namespace, times in spec.items()
        for i, ms in enumerate(times)
    }
    return objects, dict.fromkeys(objects, SIZE)


def over_quota(
    objects: dict[str, int],
    sizes: dict[str, int],
    rules: NamespaceRules,
    *,
    markers: dict[str, tuple[str, int]] | None = None,
    pending: set[str] | None = None,
    leaving: set[str] | None = None,
) -> list[Victim]:
    return select_over_quota(
        "t", objects, sizes, markers or {}, rules, NOW, REFRESH, pending or set(), leaving or set()
    )


PR_QUOTA = NamespaceRules((NamespaceRule("pr-*", quota_bytes=2 * SIZE),))


def test_a_namespace_over_its_quota_loses_its_own_oldest_and_another_keeps_all() -> None:
    objects, sizes = bucket(
        {
            "pr-1": [NOW - 5 * HOUR_MS, NOW - 9 * HOUR_MS, NOW - HOUR_MS, NOW - 7 * HOUR_MS],
            "main": [NOW - 99 * HOUR_MS] * 10,  # older and larger, but no quota
        }
    )
    got = over_quota(objects, sizes, PR_QUOTA)
    assert got == [
        Victim(object_key("t", "pr-1", "a1"), None, NOW - 9 * HOUR_MS, QUOTA),
        Victim(object_key("t", "pr-1", "a3"), None, NOW - 7 * HOUR_MS, QUOTA),
    ]


def test_each_namespace_a_pattern_matches_has_its_own_quota() -> None:
    objects, sizes = bucket({"pr-1": [NOW - HOUR_MS] * 3, "pr-2": [NOW - 2 * HOUR_MS] * 2})
    got = over_quota(objects, sizes, PR_QUOTA)
    assert [v.object_key for v in got] == [object_key("t", "pr-1", "a0")]  # pr-2 holds 2


def test_a_namespace_within_its_quota_or_without_a_rule_gives_nothing() -> None:
    objects, sizes = bucket({"pr-1": [NOW - HOUR_MS] * 2, "docs": [NOW - HOUR_MS] * 50})
    assert over_quota(objects, sizes, PR_QUOTA) == []
    assert over_quota(objects, sizes, NO_RULES) == []
    assert over_quota({}, {}, PR_QUOTA) == []


def test_a_recent_marker_makes_an_object_recently_used() -> None:
    objects, sizes = bucket({"pr-1": [NOW - 9 * HOUR_MS, NOW - 5 * HOUR_MS, NOW - 5 * HOUR_MS]})
    marker = touch_key("t", "pr-1", "a0")
    markers = {object_key("t", "pr-1", "a0"): (marker, NOW - HOUR_MS)}
    got = over_quota(objects, sizes, PR_QUOTA, markers=markers)
    assert [v.object_key for v in got] == [object_key("t", "pr-1", "a1")]
    # ... and a victim's marker goes with it.
    markers = {object_key("t", "pr-1", "a0"): (marker, NOW - 8 * HOUR_MS)}
    got = over_quota(objects, sizes, PR_QUOTA, markers=markers)
    assert got == [Victim(object_key("t", "pr-1", "a0"), marker, NOW - 8 * HOUR_MS, QUOTA)]


def test_an_object_whose_upload_is_pending_here_is_kept_and_still_counts() -> None:
    objects, sizes = bucket({"pr-1": [NOW - 9 * HOUR_MS, NOW - 5 * HOUR_MS, NOW - HOUR_MS]})
    got = over_quota(objects, sizes, PR_QUOTA, pending={"a0"})
    assert [v.object_key for v in got] == [object_key("t", "pr-1", "a1")]
    # Only pending ones left to take: the namespace stays over until the uploads land.
    assert over_quota(objects, sizes, PR_QUOTA, pending={"a0", "a1", "a2"}) == []


def test_objects_expired_in_the_same_pass_no_longer_count() -> None:
    objects, sizes = bucket({"pr-1": [NOW - 9 * HOUR_MS, NOW - 5 * HOUR_MS, NOW - HOUR_MS]})
    assert over_quota(objects, sizes, PR_QUOTA, leaving={object_key("t", "pr-1", "a0")}) == []


def test_sizes_are_the_listed_bytes() -> None:
    objects, sizes = bucket({"pr-1": [NOW - 9 * HOUR_MS, NOW - 5 * HOUR_MS, NOW - HOUR_MS]})
    sizes[object_key("t", "pr-1", "a0")] = 1  # the oldest is tiny: the next must go too
    got = over_quota(objects, sizes, NamespaceRules((NamespaceRule("pr-*", quota_bytes=SIZE),)))
    assert [v.object_key for v in got] == [
        object_key("t", "pr-1", "a0"),
        object_key("t", "pr-1", "a1"),
    ]


def test_min_age_is_respected_while_older_objects_suffice_then_forced() -> None:
    rule = NamespaceRule("pr-*", quota_bytes=2 * SIZE, min_age_seconds=3600)
    rules = NamespaceRules((rule,))
    # a0 9 h old, a1 and a2 used 30 min ago (inside the 1 h min_age), a3 5 h old.
    times = [NOW - 9 * HOUR_MS, NOW - HOUR_MS // 2, NOW - HOUR_MS // 2, NOW - 5 * HOUR_MS]
    objects, sizes = bucket({"pr-1": times})
    got = over_quota(objects, sizes, rules)
    assert [(v.object_key, v.reason) for v in got] == [
        (object_key("t", "pr-1", "a0"), QUOTA),
        (object_key("t", "pr-1", "a3"), QUOTA),
    ]
    # With the old ones pending, only young ones can bring it under: a hard cap, forced.
    got = over_quota(objects, sizes, rules, pending={"a0", "a3"})
    assert [(v.object_key, v.reason) for v in got] == [
        (object_key("t", "pr-1", "a1"), FORCED),
        (object_key("t", "pr-1", "a2"), FORCED),
    ]


def test_min_age_leaves_the_markers_refresh_as_slack() -> None:
    rules = NamespaceRules((NamespaceRule("pr-*", quota_bytes=SIZE, min_age_seconds=3600),))
    just_outside = NOW - HOUR_MS - REFRESH  # the marker may lag a use by the refresh
    objects, sizes = bucket({"pr-1": [just_outside, NOW - 2 * HOUR_MS]})
    got = over_quota(objects, sizes, rules)
    assert [(v.object_key, v.reason) for v in got] == [(object_key("t", "pr-1", "a1"), QUOTA)]
    got = over_quota(objects, sizes, rules, pending={"a1"})
    assert [(v.object_key, v.reason) for v in got] == [(object_key("t", "pr-1", "a0"), FORCED)]


def test_quotas_alone_turn_the_bucket_pass_on_and_pace_markers_at_the_interval() -> None:
    assert retention_in_bucket(PR_QUOTA, 0)
    assert not retention_in_bucket(NO_RULES, 0)
    assert retention_in_bucket(NO_RULES, 60)
    assert marker_age_seconds(PR_QUOTA, 0, 30) == 120  # refreshed once per 30 s pass
    assert marker_refresh_ms(marker_age_seconds(PR_QUOTA, 0, 30)) == 30_000
    assert marker_age_seconds(PR_QUOTA, 3600, 30) == 3600  # an age sets the pace
