"""``kura.api.upload_rate``, the listeners' one rule for slow uploads, on virtual time."""

from __future__ import annotations

import gc
import math

from kura.api import upload_rate
from kura.api.upload_rate import UploadRule
from kura.settings import Settings

RULE = UploadRule(idle_seconds=60.0, min_bytes_per_second=1000, grace_seconds=10.0)


def test_within_the_grace_period_only_a_stall_gives_up() -> None:
    meter = RULE.meter(100.0)
    assert meter.verdict(109.9) is None
    assert meter.deadline() == 110.0  # nothing came: below any rate once the grace ends
    assert meter.verdict(110.0) == "slow"


def test_bytes_buy_time_at_the_minimum_rate() -> None:
    meter = RULE.meter(0.0)
    meter.add(30_000, 5.0)  # 30 s worth at 1,000 B/s
    assert meter.slow_at() == 30.0
    assert meter.seconds_left(5.0) == 25.0
    assert meter.verdict(29.9) is None
    assert meter.verdict(30.0) == "slow"


def test_an_empty_message_is_no_sign_of_life() -> None:
    rule = UploadRule(idle_seconds=5.0, min_bytes_per_second=0, grace_seconds=10.0)
    meter = rule.meter(0.0)
    meter.add(10, 1.0)
    meter.add(0, 4.0)
    assert meter.slow_at() == math.inf  # no minimum rate
    assert meter.deadline() == 6.0
    assert meter.verdict(6.0) == "stalled"


def test_a_timer_that_fires_a_hair_early_names_the_nearer_deadline() -> None:
    meter = RULE.meter(0.0)
    meter.add(50_000, 1.0)  # slow at 50 s, stalled at 61 s
    assert meter.verdict(49.999) is None
    assert meter.due(49.999) == "slow"
    stalled = UploadRule(idle_seconds=2.0, min_bytes_per_second=1000, grace_seconds=10.0)
    meter = stalled.meter(0.0)
    meter.add(50_000, 1.0)
    assert meter.due(2.999) == "stalled"


def test_the_rule_of_a_settings_object_is_built_once_and_forgotten_with_it() -> None:
    """Every listener asks ``UploadRule.of`` (HTTP bodies, the forwarder, gRPC): one rule per
    settings object, shared; another object gets its own; a collected one leaves nothing."""
    settings = Settings(min_upload_bytes_per_second=1000)
    rule = UploadRule.of(settings)
    assert rule == UploadRule(
        float(settings.body_idle_timeout_seconds), 1000, float(settings.upload_grace_seconds)
    )
    assert UploadRule.of(settings) is rule
    other = Settings(min_upload_bytes_per_second=2000)
    assert UploadRule.of(other).min_bytes_per_second == 2000
    kept = id(other)
    assert kept in upload_rate._RULES
    del other
    gc.collect()
    assert kept not in upload_rate._RULES
    assert UploadRule.of(settings) is rule
