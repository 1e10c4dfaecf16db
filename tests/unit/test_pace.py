"""kit.pace: N units at rate r take at least N / r seconds, on virtual time."""

from __future__ import annotations

import pytest

from kit.pace import Pace, seconds_ahead


def test_seconds_ahead() -> None:
    assert seconds_ahead(10, 5, 0.5) == pytest.approx(1.5)
    assert seconds_ahead(10, 5, 3.0) == 0.0


async def test_pace_sleeps_only_while_ahead_of_the_rate() -> None:
    now = [100.0]
    slept: list[float] = []

    async def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    pace = Pace(4, lambda: now[0], sleep)
    await pace.wait(2)  # 2 units at 4/s: 0.5 s
    now[0] += 1.0  # slow work: behind the rate, no wait
    await pace.wait(4)
    await pace.wait(12)  # 12 units need 3 s; 1.5 s passed
    assert slept == pytest.approx([0.5, 1.5])
    with pytest.raises(ValueError, match="rate"):
        Pace(0, lambda: 0.0)
