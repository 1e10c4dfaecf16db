"""The disk budget rule (kura.core.eviction.bytes_to_free)."""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from kura.core.eviction import LOW_WATERMARK, bytes_to_free

SIZES = st.integers(0, 2**44)


@given(used=SIZES, incoming=SIZES, limit=st.integers(1, 2**44))
def test_after_freeing_the_answer_the_write_fits_under_the_limit(
    used: int, incoming: int, limit: int
) -> None:
    assume(incoming <= limit)  # larger writes are rejected (507) before eviction is asked
    free = bytes_to_free(used, incoming, limit)
    assert free >= 0
    assert used - free + incoming <= limit
    assert free <= used  # never asks to evict more than is stored


@given(used=SIZES, incoming=SIZES, limit=st.integers(1, 2**44))
def test_nothing_is_freed_when_the_write_already_fits(used: int, incoming: int, limit: int) -> None:
    assume(used + incoming <= limit)
    assert bytes_to_free(used, incoming, limit) == 0


@given(used=SIZES, incoming=SIZES, limit=st.integers(100, 2**44))
def test_a_pass_frees_down_to_the_low_watermark(used: int, incoming: int, limit: int) -> None:
    assume(incoming <= limit and used + incoming > limit)
    free = bytes_to_free(used, incoming, limit)
    assert used - free + incoming <= max(int(limit * LOW_WATERMARK), incoming)


@pytest.mark.parametrize(
    ("used", "incoming", "limit", "expected"),
    [
        (0, 100, 100, 0),
        (100, 0, 100, 0),
        (100, 1, 100, 6),  # down to 95 - 1 = 94 used
        (1000, 1000, 1000, 1000),  # the new write needs everything
    ],
)
def test_known_answers(used: int, incoming: int, limit: int, expected: int) -> None:
    assert bytes_to_free(used, incoming, limit) == expected
