"""kit.event_loop: the setting resolves to the loop it names, and ``run`` runs on it."""

from __future__ import annotations

import pytest

from kit import event_loop


async def _name() -> str:
    return event_loop.running_loop_name()


@pytest.mark.parametrize(
    ("setting", "expected"), [("asyncio", "asyncio"), ("uvloop", "uvloop"), ("auto", "uvloop")]
)
def test_run_runs_the_coroutine_on_the_loop_the_setting_names(setting: str, expected: str) -> None:
    # auto is uvloop: the dev extra installs kura[uvloop] (pyproject.toml), so it is importable here.
    assert event_loop.choose(setting)[0] == expected
    assert event_loop.run(_name(), setting) == expected


def test_a_setting_outside_the_closed_set_is_refused() -> None:
    with pytest.raises(ValueError, match="auto, asyncio, uvloop"):
        event_loop.choose("trio")


def test_no_running_loop_is_a_runtime_error() -> None:
    with pytest.raises(RuntimeError):
        event_loop.running_loop_name()
