"""kit.log's formats: ``json`` puts a record, its traceback included, on one line of JSON."""

from __future__ import annotations

import io
import json
import logging

import pytest

from kit import log as kit_log


def test_json_keeps_a_traceback_inside_its_one_line() -> None:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(kit_log.formatter("json"))
    logger = logging.getLogger("kit.test.json")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        try:
            1 / 0  # noqa: B018
        except ZeroDivisionError:
            logger.exception("division of %s failed", "one")
        logger.warning('plain, with a quote " and é')
    finally:
        logger.removeHandler(handler)
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert first["message"] == "division of one failed"
    assert first["level"] == "ERROR"
    assert first["logger"] == "kit.test.json"
    assert first["exception"].startswith("Traceback (most recent call last):")
    assert first["exception"].endswith("ZeroDivisionError: division by zero")
    assert second["message"] == 'plain, with a quote " and é'
    assert "exception" not in second


def test_an_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="text, json"):
        kit_log.formatter("xml")
