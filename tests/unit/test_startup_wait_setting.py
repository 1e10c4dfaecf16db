"""KURA_STARTUP_WAIT_SECONDS: a whole number of seconds from 0 to 60
(``storage.startup_work.MAX_WAIT_SECONDS``); past it the start is refused, naming the bound."""

from __future__ import annotations

import pytest

from kit.settings import SettingsError, load
from kura.cli import build_parser
from kura.settings import Settings, validate_settings


def startup_wait(text: str) -> int:
    args = build_parser().parse_args(["serve"])
    settings = load(Settings, args, {"KURA_STARTUP_WAIT_SECONDS": text}, validate=validate_settings)
    return settings.startup_wait_seconds


@pytest.mark.parametrize(("text", "seconds"), [("0", 0), ("10", 10), ("60", 60)])
def test_a_wait_up_to_a_minute_is_taken(text: str, seconds: int) -> None:
    assert startup_wait(text) == seconds


@pytest.mark.parametrize("text", ["61", "3600", "-1", "1.5", "ten"])
def test_a_wait_past_a_minute_or_not_whole_seconds_is_refused(text: str) -> None:
    with pytest.raises(SettingsError) as refused:
        startup_wait(text)
    assert "KURA_STARTUP_WAIT_SECONDS" in str(refused.value)
    assert "from 0 to 60" in str(refused.value)
