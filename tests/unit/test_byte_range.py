"""The Range / If-Range rules of RFC 9110 §14 and §13.1.5 (kura.core.byte_range)."""

from __future__ import annotations

import pytest

from kura.core.byte_range import FULL, UNSATISFIABLE, ByteRange, choose, strong_etag

ETAG = strong_etag("ab" * 32)


@pytest.mark.parametrize(
    ("header", "want"),
    [
        ("bytes=0-0", ByteRange(0, 0, 100)),
        ("bytes=10-19", ByteRange(10, 19, 100)),
        ("bytes=90-", ByteRange(90, 99, 100)),
        ("bytes=-10", ByteRange(90, 99, 100)),
        ("bytes=-1000", ByteRange(0, 99, 100)),
        ("bytes=5-1000", ByteRange(5, 99, 100)),
        ("Bytes=5-6", ByteRange(5, 6, 100)),
        ("bytes= 5-6 ,", ByteRange(5, 6, 100)),  # OWS and an empty list element
        ("bytes=000000000000000000000005-6", ByteRange(5, 6, 100)),
        ("bytes=5-99999999999999999999999999", ByteRange(5, 99, 100)),
        ("bytes=100-", UNSATISFIABLE),
        ("bytes=100-200", UNSATISFIABLE),
        ("bytes=99999999999999999999999-", UNSATISFIABLE),
        ("bytes=-0", UNSATISFIABLE),
        (None, FULL),
        ("bytes=6-5", FULL),
        ("bytes=-", FULL),
        ("bytes=", FULL),
        ("bytes=a-b", FULL),
        ("bytes=-+5", FULL),
        ("bytes=1 -2", FULL),
        ("bytes=0-1,3-4", FULL),
        ("bytes=0-1,0-1", FULL),
        ("items=0-1", FULL),
        ("bytes 0-1", FULL),
        ("=0-1", FULL),
    ],
)
def test_a_range_header_is_answered_as_rfc_9110_says(header: str | None, want: object) -> None:
    assert choose(header, None, 100, ETAG) == want


def test_an_empty_representation_is_always_sent_whole() -> None:
    assert choose("bytes=0-", None, 0, ETAG) == FULL
    assert choose("bytes=-5", None, 0, ETAG) == FULL


@pytest.mark.parametrize(
    ("if_range", "want"),
    [
        (ETAG, ByteRange(1, 2, 100)),
        (f" {ETAG} ", ByteRange(1, 2, 100)),
        ("W/" + ETAG, FULL),  # If-Range compares strongly
        ('"other"', FULL),
        ("Tue, 01 Dec 2026 10:00:00 GMT", FULL),  # no Last-Modified: a date never matches
        ("", FULL),
    ],
)
def test_if_range_lets_a_range_through_only_for_the_same_strong_etag(
    if_range: str, want: object
) -> None:
    assert choose("bytes=1-2", if_range, 100, ETAG) == want


def test_content_range_names_the_inclusive_bytes_and_the_size() -> None:
    r = ByteRange(10, 19, 100)
    assert r.length_bytes == 10
    assert r.content_range == "bytes 10-19/100"
