"""storage.fsync.descriptor_shortage: a reading of the process's descriptors for /ready."""

from __future__ import annotations

import errno
import itertools
import logging
import os
import resource
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from kit.clock import ManualClock, SystemClock
from kura.storage import fsync, recovery
from kura.storage import service as service_module
from kura.storage.budget import TmpBudget
from kura.storage.service import (
    STARTUP_RETRY_MAX_SECONDS,
    STARTUP_RETRY_SECONDS,
    CacheService,
)

MiB = 1024 * 1024


def test_a_missing_dev_null_is_not_a_shortage_and_raises_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A sandbox without /dev/null: /ready and a miss must not become a 500."""
    monkeypatch.setattr(fsync.os, "devnull", str(tmp_path / "absent"))
    assert fsync.descriptor_shortage() is None


def _no_descriptor_left() -> tuple[int, int]:
    """Lower this process's soft limit to its lowest free descriptor; the old limits."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowest_free = os.dup(0)
    os.close(lowest_free)
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))
    return soft, hard


def test_no_descriptor_left_is_a_shortage_and_the_reading_clears_with_it() -> None:
    soft, hard = _no_descriptor_left()
    try:
        found = fsync.descriptor_shortage()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert found is not None
    assert found.errno == errno.EMFILE
    assert fsync.descriptor_shortage() is None


def test_a_reading_is_kept_for_a_tenth_of_a_second_on_its_clock_and_then_taken_again() -> None:
    clock = ManualClock()
    reading = fsync.ShortageReading(clock.monotonic)
    soft, hard = _no_descriptor_left()
    try:
        found = reading()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert found is not None
    assert found.errno == errno.EMFILE
    clock.advance(fsync.SHORTAGE_READING_SECONDS / 2)
    assert reading() is found  # the last reading, not a new one
    clock.advance(fsync.SHORTAGE_READING_SECONDS)
    assert reading() is None  # taken again: the shortage passed
    assert reading.probes == 2


async def test_write_refusals_asked_a_thousand_times_opens_dev_null_at_most_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``/ready``, ``/status`` and the read-through decision at every local miss while joining
    ask storage why writes are refused; on main each call opened and closed ``/dev/null``
    (1,000 opens here). ``os.open`` is observed, not replaced: every call still opens."""
    service = CacheService(
        data_dir=tmp_path / "data",
        tmp_dir=tmp_path / "tmp",
        tenant_id="t",
        budget=TmpBudget(MiB, tmp_dir=tmp_path / "tmp"),
        clock=SystemClock(),
        max_disk_bytes=64 * MiB,
        min_free_disk_bytes=0,
    )
    await service.start()
    opened: list[str] = []
    real_open = os.open

    def observed_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if str(path) == os.devnull:
            opened.append(str(path))
        return real_open(path, flags, *args, **kwargs)

    try:
        monkeypatch.setattr(fsync.os, "open", observed_open)
        for _ in range(1000):
            assert service.write_refusals() == []
        monkeypatch.undo()
    finally:
        await service.close()
    assert len(opened) <= 2, len(opened)


def test_an_index_that_cannot_open_for_want_of_a_descriptor_is_not_damaged(
    tmp_path: Path,
) -> None:
    """SQLITE_CANTOPEN at the index's first open is damage (recovery), unless the process is
    short of descriptors: then it passes, and marking the index damaged would set it and
    every blob aside."""
    soft, hard = _no_descriptor_left()
    try:
        with pytest.raises(sqlite3.OperationalError) as short:
            sqlite3.connect(tmp_path / "index.sqlite3").execute("SELECT 1")
        damage = recovery.is_damage(short.value, at_first_open=True)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert short.value.sqlite_errorname == "SQLITE_CANTOPEN"
    assert not damage
    with pytest.raises(sqlite3.OperationalError) as missing:  # no descriptor shortage now
        sqlite3.connect(tmp_path / "absent" / "index.sqlite3")
    assert missing.value.sqlite_errorname == "SQLITE_CANTOPEN"
    assert recovery.is_damage(missing.value, at_first_open=True)
    assert not recovery.is_damage(missing.value)  # the index open: never damage


def test_a_temp_file_sqlite_cannot_open_mid_statement_is_a_shortage_not_damage(
    tmp_path: Path,
) -> None:
    """Review: once the index is open, SQLite reports a temp file it could not open (a GROUP
    BY's ephemeral table here) as SQLITE_CANTOPEN. Descriptors short inside the statement
    only, free again when the error is classified (the probe reads no shortage): it used to
    be damage, and the start-up check or reconciliation set the index and every blob aside."""
    conn = sqlite3.connect(tmp_path / "index.sqlite3")
    conn.execute("CREATE TABLE t(a INTEGER PRIMARY KEY, b TEXT)")
    conn.executemany(
        "INSERT INTO t(b) VALUES (?)", [(os.urandom(16).hex(),) for _ in range(50_000)]
    )
    conn.commit()
    squeezed: list[tuple[int, int]] = []

    def squeeze() -> int:  # the progress handler: inside the statement, once
        if not squeezed:
            squeezed.append(_no_descriptor_left())
        return 0

    conn.set_progress_handler(squeeze, 1)
    try:
        with pytest.raises(sqlite3.OperationalError) as failed:
            conn.execute("SELECT substr(b, 1, 2), COUNT(*) FROM t GROUP BY 1 ORDER BY 2").fetchall()
    finally:
        for soft, hard in squeezed:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    conn.set_progress_handler(None, 1)
    assert squeezed
    assert failed.value.sqlite_errorname == "SQLITE_CANTOPEN"
    assert fsync.descriptor_shortage() is None  # passed: the probe alone cannot tell
    assert not recovery.is_damage(failed.value)
    assert service_module._shortage(failed.value) == "descriptors"  # retried, not fatal
    assert conn.execute("SELECT COUNT(*) FROM t").fetchone() == (50_000,)  # the index is fine
    conn.close()


async def test_start_up_retries_a_shortage_with_a_jittered_backoff_and_keeps_no_closed_connection(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Review: the start-up work retried a shortage every 5 s with a WARNING each time, and
    each retry left its closed connection in ``MetadataIndex._opened``. Four walks fail for
    want of a descriptor (the process's limit squeezed at the ``reconcile`` point, lifted at
    the next); the waits between them, on the injected clock, are 5 s doubling (equal jitter:
    within [ceiling / 2, ceiling]); one WARNING inside the minute."""
    clock = ManualClock()
    service = CacheService(
        data_dir=tmp_path / "data",
        tmp_dir=tmp_path / "tmp",
        tenant_id="t",
        budget=TmpBudget(MiB, tmp_dir=tmp_path / "tmp"),
        clock=clock,
        max_disk_bytes=64 * MiB,
        min_free_disk_bytes=0,
    )
    await service.start(background=True)
    limits = resource.getrlimit(resource.RLIMIT_NOFILE)
    failures = 4
    attempts: list[float] = []

    def hook(point: str) -> None:
        if point != "reconcile":
            return
        resource.setrlimit(resource.RLIMIT_NOFILE, limits)  # the last shortage passed
        attempts.append(clock.monotonic())
        if len(attempts) <= failures:
            _no_descriptor_left()

    service.startup.hook = hook
    try:
        with caplog.at_level(logging.WARNING, logger="kura.storage.service"):
            await service.finish_start()
        resource.setrlimit(resource.RLIMIT_NOFILE, limits)
        assert service.startup.done
        gaps = [b - a for a, b in itertools.pairwise(attempts)]
        assert len(gaps) == failures, attempts
        for n, gap in enumerate(gaps, 1):
            ceiling = min(STARTUP_RETRY_MAX_SECONDS, STARTUP_RETRY_SECONDS * 2 ** (n - 1))
            assert ceiling / 2 <= gap <= ceiling, gaps
        lines = [r for r in caplog.records if "failed for want of descriptors" in r.getMessage()]
        assert len(lines) == 1, [r.getMessage() for r in lines]
        # The writer's connection and at most one more: none of the closed start-up ones.
        assert len(service._require_index()._opened) <= 2
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, limits)
        await service.close()
