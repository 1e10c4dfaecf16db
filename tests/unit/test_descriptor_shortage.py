"""storage.fsync.descriptor_shortage: a reading of the process's descriptors for /ready."""

from __future__ import annotations

import errno
import os
import resource
from pathlib import Path

import pytest

from kura.storage import fsync


def test_a_missing_dev_null_is_not_a_shortage_and_raises_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A sandbox without /dev/null: /ready and a miss must not become a 500."""
    monkeypatch.setattr(fsync.os, "devnull", str(tmp_path / "absent"))
    assert fsync.descriptor_shortage() is None


def test_no_descriptor_left_is_a_shortage_and_the_reading_clears_with_it() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowest_free = os.dup(0)
    os.close(lowest_free)
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))
    try:
        found = fsync.descriptor_shortage()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert found is not None
    assert found.errno == errno.EMFILE
    assert fsync.descriptor_shortage() is None
