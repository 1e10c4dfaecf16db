"""``kit.flock``: a held lock is refused at once, naming its holder from /proc/locks."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kit import flock


def test_a_held_lock_is_refused_naming_the_holders_pid_and_is_free_once_closed(
    tmp_path: Path,
) -> None:
    path = tmp_path / "owner.lock"
    fd = flock.exclusive(path)
    try:
        with pytest.raises(flock.Held) as held:
            flock.exclusive(path)  # another open file description: flock(2) conflicts
        assert held.value.pid == os.getpid()
        assert f"pid {os.getpid()}" in str(held.value)
    finally:
        os.close(fd)
    os.close(flock.exclusive(path))


def test_a_lock_nobody_holds_has_no_holder(tmp_path: Path) -> None:
    path = tmp_path / "free.lock"
    path.touch()
    assert flock.holder(path.stat()) is None
    assert flock.holder(path.stat(), locks=tmp_path / "no-such-file") is None
