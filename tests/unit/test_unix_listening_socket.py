"""The primary's unix sockets (the workers' and ``admin.sock``) replace a socket a crash left,
and refuse anything else there, naming it and leaving it as it was (a hostile test found a
regular file at ``admin.sock`` silently deleted, a directory refused with a bare errno)."""

from __future__ import annotations

import socket
import stat
from pathlib import Path

import pytest

from kura.api.connections import ConnectionGuard, unix_listening_socket


def test_a_stale_socket_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "admin.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))
    stale.close()
    sock = unix_listening_socket(ConnectionGuard(4), str(path))
    try:
        assert stat.S_ISSOCK(path.stat().st_mode)
    finally:
        sock.close()


@pytest.mark.parametrize("kind", ["file", "directory", "symlink"])
def test_anything_else_there_is_refused_by_name_and_left_alone(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "admin.sock"
    target = tmp_path / "precious"
    target.write_text("an operator's file")
    if kind == "file":
        path.write_text("an operator's file")
    elif kind == "directory":
        path.mkdir()
    else:
        path.symlink_to(target)
    with pytest.raises(OSError, match="something other than a socket") as refused:
        unix_listening_socket(ConnectionGuard(4), str(path))
    assert str(path) in str(refused.value)
    assert path.exists() or path.is_symlink()
    assert target.read_text() == "an operator's file"
