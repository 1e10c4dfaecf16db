"""``kit.log_ring.LogRing``: bounded, newest first, WARNING and above only."""

from __future__ import annotations

import logging

from kit.log_ring import MESSAGE_MAX_CHARS, LogRing


def test_ring_keeps_only_the_newest_warnings_and_errors_newest_first() -> None:
    logger = logging.getLogger("test.log_ring.bounded")
    ring = LogRing(capacity=3)
    ring.attach(logger)
    try:
        logger.info("not kept")
        for i in range(5):
            logger.warning("warning %d", i)
        logger.error("last")
    finally:
        ring.detach()
    logger.error("after detach")
    records = ring.records()
    assert [r["message"] for r in records] == ["last", "warning 4", "warning 3"]
    assert [r["level"] for r in records] == ["ERROR", "WARNING", "WARNING"]
    assert records[0]["logger"] == "test.log_ring.bounded"
    assert records[0]["at"].endswith("+00:00")


def test_ring_cuts_long_messages_and_names_the_exception() -> None:
    logger = logging.getLogger("test.log_ring.long")
    ring = LogRing()
    ring.attach(logger)
    try:
        logger.warning("x" * (MESSAGE_MAX_CHARS * 3))
        try:
            raise ValueError("bad value")
        except ValueError:
            logger.exception("failed")
    finally:
        ring.detach()
    failed, long = ring.records()
    assert failed["message"] == "failed (ValueError: bad value)"
    assert len(long["message"]) == MESSAGE_MAX_CHARS
