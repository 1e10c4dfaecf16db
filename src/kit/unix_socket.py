"""The address of a unix socket file in a directory, whatever the directory's path length.

``sun_path`` holds 107 bytes on Linux (unix(7)); a longer path cannot be bound or connected to
as it is. Linux resolves ``/proc/self/fd/N/NAME`` like any path, ``N`` an open descriptor of
the directory, so the same file is reached through a short address instead. Both the process
that binds it and the one that connects use this (``kura serve``'s ``admin.sock``, ``kura
admin``).
"""

from __future__ import annotations

import os
from pathlib import Path

MAX_SUN_PATH = 107  # bytes, the terminating NUL left out (unix(7))


def socket_address(directory: Path, name: str) -> tuple[str, int | None]:
    """The address of ``directory/name`` and a descriptor the caller closes once it bound or
    connected (None: none was opened): the path itself when it fits ``MAX_SUN_PATH``, else
    ``/proc/self/fd/N/name``. ``OSError`` when ``directory`` cannot be opened."""
    path = str(directory / name)
    if len(os.fsencode(path)) <= MAX_SUN_PATH:
        return path, None
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    return f"/proc/self/fd/{fd}/{name}", fd
