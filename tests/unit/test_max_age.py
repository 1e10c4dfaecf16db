"""KURA_MAX_AGE and the expiry settings: the age syntax (days on top of the duration syntax),
defaults, the flag, and every bad value reported with the others."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from kit.settings import SettingsError, load
from kura.cli import build_parser
from kura.settings import Settings, validate_settings


def settings_from(environ: Mapping[str, str], *flags: str) -> Settings:
    args = build_parser().parse_args(["serve", *flags])
    return load(Settings, args, environ, validate=validate_settings)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30d", 30 * 86400.0),
        ("1d12h", 36 * 3600.0),
        ("2d30m", 2 * 86400.0 + 1800),
        ("12h", 12 * 3600.0),
        ("90s", 90.0),
        ("1h30m", 5400.0),
        ("45", 45.0),
        ("0", 0.0),
        (" 7d ", 7 * 86400.0),
    ],
)
def test_max_age_reads_days_hours_minutes_seconds_and_plain_seconds(
    text: str, seconds: float
) -> None:
    assert settings_from({"KURA_MAX_AGE": text}).max_age_seconds == seconds


@pytest.mark.parametrize(
    "text", ["-1d", "d", "3w", "1dx", "1d-5s", "-5s", "inf", "nan", "", "1.5d"]
)
def test_max_age_refuses_what_is_not_an_age(text: str) -> None:
    with pytest.raises(SettingsError) as raised:
        settings_from({"KURA_MAX_AGE": text})
    assert any("KURA_MAX_AGE" in p and "30d" in p for p in raised.value.problems)


def test_expiry_is_off_by_default_and_the_flag_wins_over_the_environment() -> None:
    s = settings_from({})
    assert s.max_age_seconds == 0
    assert s.expiry_interval_seconds == 300
    assert s.expiry_max_deletes_per_second == 200
    assert s.expiry_batch_size == 100
    s = settings_from({"KURA_MAX_AGE": "1d"}, "--max-age", "12h", "--expiry-interval", "30s")
    assert s.max_age_seconds == 12 * 3600
    assert s.expiry_interval_seconds == 30


def test_bad_expiry_settings_are_all_reported_at_once() -> None:
    with pytest.raises(SettingsError) as raised:
        settings_from(
            {
                "KURA_MAX_AGE": "soon",
                "KURA_EXPIRY_INTERVAL": "0",
                "KURA_EXPIRY_MAX_DELETES_PER_SECOND": "0",
                "KURA_EXPIRY_BATCH_SIZE": "-3",
            }
        )
    text = " ".join(raised.value.problems)
    for name in (
        "KURA_MAX_AGE",
        "KURA_EXPIRY_INTERVAL",
        "KURA_EXPIRY_MAX_DELETES_PER_SECOND",
        "KURA_EXPIRY_BATCH_SIZE",
    ):
        assert name in text
