"""The writer thread's group commit (``kura.storage.group_commit``): jobs run in order, a group
shares one sync, no future resolves before its group's sync, a failed sync fails the group
and keeps the files it would have unlinked, and a sync short of descriptors latches nothing."""

from __future__ import annotations

import errno
import threading
from pathlib import Path

import pytest

from kit.wait import wait_until
from kura.core.errors import Unavailable
from kura.storage.fsync import DescriptorShortage
from kura.storage.group_commit import GroupCommitWriter

WAIT = 10.0


class CountingSync:
    """A ``sync`` that counts its calls, can be held closed, and can be made to fail."""

    def __init__(self) -> None:
        self.calls = 0
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.fail: Exception | None = None

    def __call__(self) -> None:
        self.entered.set()
        assert self.gate.wait(WAIT)
        self.calls += 1
        if self.fail is not None:
            raise self.fail


@pytest.fixture
def writer() -> GroupCommitWriter:
    w = GroupCommitWriter("test-write")
    yield w  # type: ignore[misc]
    w.shutdown()


def test_jobs_run_in_order_with_their_results_and_exceptions(writer: GroupCommitWriter) -> None:
    seen: list[int] = []

    def job(i: int) -> int:
        seen.append(i)
        if i == 3:
            raise ValueError("job 3")
        return i * 10

    futures = [writer.submit(job, i) for i in range(6)]
    assert [f.exception(WAIT) is None for f in futures] == [True, True, True, False, True, True]
    assert [f.result() for i, f in enumerate(futures) if i != 3] == [0, 10, 20, 40, 50]
    with pytest.raises(ValueError, match="job 3"):
        futures[3].result()
    assert seen == list(range(6))


def test_writes_queued_during_a_sync_share_the_next_one(writer: GroupCommitWriter) -> None:
    sync = CountingSync()
    writer.set_sync(sync)
    sync.gate.clear()
    first = writer.submit(lambda: "first")
    assert sync.entered.wait(WAIT)  # the lone first write is syncing, held
    rest = [writer.submit(lambda i=i: i) for i in range(40)]
    assert not first.done()  # acknowledged only after its sync
    assert not any(f.done() for f in rest)
    sync.gate.set()
    assert first.result(WAIT) == "first"
    assert [f.result(WAIT) for f in rest] == list(range(40))
    assert sync.calls == 2
    assert writer.stats.groups_total == 2
    assert writer.stats.jobs_total == 41
    assert writer.stats.largest_group == 40


def test_a_failed_sync_fails_the_groups_writes_and_keeps_what_they_replaced(
    writer: GroupCommitWriter, tmp_path: Path
) -> None:
    sync = CountingSync()
    sync.fail = OSError(5, "Input/output error")
    writer.set_sync(sync)
    old = tmp_path / "old-version"
    old.write_bytes(b"acknowledged bytes")

    def replace() -> str:
        writer.unlink_later(old)
        assert old.exists()  # not before the group is durable
        return "replaced"

    def broken() -> None:
        raise ValueError("its own failure")

    ok, bad = writer.submit(replace), writer.submit(broken)
    with pytest.raises(Unavailable, match="could not be made durable"):
        ok.result(WAIT)
    with pytest.raises(ValueError, match="its own failure"):
        bad.result(WAIT)
    assert old.read_bytes() == b"acknowledged bytes"
    assert writer.stats.sync_failures_total == 1
    assert writer.stats.groups_total == 0  # nothing was made durable
    # A later fsync may succeed without the lost pages: the writer refuses every later job.
    sync.fail = None
    ran: list[int] = []
    later = writer.submit(ran.append, 7)
    with pytest.raises(Unavailable, match="refuses every write until it is restarted"):
        later.result(WAIT)
    assert ran == []
    assert writer.failure is not None
    assert sync.calls == 1


def test_a_sync_short_of_descriptors_fails_its_group_only_and_is_retried_by_itself(
    writer: GroupCommitWriter, tmp_path: Path
) -> None:
    """EMFILE when opening the WAL to fsync it (issue 26): no fsync ran, so nothing latches.
    The group's writes fail, what they replaced is kept until a sync succeeds, and the writer
    retries on its own, with no write arriving, until one does."""
    sync = CountingSync()
    sync.fail = DescriptorShortage(errno.EMFILE, "Too many open files", "index.sqlite3-wal")
    writer.set_sync(sync)
    old = tmp_path / "old-version"
    old.write_bytes(b"acknowledged bytes")
    first = writer.submit(writer.unlink_later, old)
    with pytest.raises(Unavailable, match="retry later"):
        first.result(WAIT)
    assert writer.failure is None
    assert writer.shortage is not None
    assert "descriptors" in writer.shortage
    assert old.exists()
    calls = sync.calls
    sync.fail = None  # descriptors free up; nobody writes
    assert wait_until(lambda: writer.shortage is None, WAIT)
    assert sync.calls > calls
    assert not old.exists()  # carried to the sync that succeeded
    assert writer.stats.sync_shortages_total >= 1
    assert writer.stats.sync_failures_total == 0
    assert writer.submit(lambda: "taken").result(WAIT) == "taken"


def test_unlinks_wait_for_the_sync_and_a_republished_name_is_kept(
    writer: GroupCommitWriter, tmp_path: Path
) -> None:
    sync = CountingSync()
    writer.set_sync(sync)
    gone, kept = tmp_path / "replaced", tmp_path / "stored-again"
    gone.write_bytes(b"x")
    kept.write_bytes(b"y")

    def job() -> None:
        writer.unlink_later(gone)
        writer.unlink_later(kept)
        writer.published(kept)  # a later job of the group stored this very version again

    writer.submit(job).result(WAIT)
    assert not gone.exists()
    assert kept.read_bytes() == b"y"


def test_calls_off_the_writer_thread_act_at_once(writer: GroupCommitWriter, tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x")
    writer.unlink_later(path)
    assert not path.exists()
    writer.sync_dir_later(tmp_path)  # an fsync now; must not raise
    with pytest.raises(FileNotFoundError):
        writer.sync_dir_later(tmp_path / "missing")


def test_shutdown_finishes_queued_jobs_then_refuses_new_ones() -> None:
    w = GroupCommitWriter("test-write")
    gate = threading.Event()
    blocker = w.submit(gate.wait, WAIT)
    queued = [w.submit(lambda i=i: i) for i in range(5)]
    threading.Timer(0.2, gate.set).start()
    w.shutdown(wait=True)
    assert blocker.result() is True
    assert [f.result() for f in queued] == list(range(5))
    with pytest.raises(RuntimeError, match="after shutdown"):
        w.submit(lambda: None)
