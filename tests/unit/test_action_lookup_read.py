"""``action_lookup.read_all`` cancelled while its thread is reading (the completeness check's
``asyncio.timeout``, a client gone): the look-up ends at once, and the file is closed only after
the read returned. Closing the buffered file under the reading thread waited for that read on
the event loop (CPython's buffered ``close`` takes the lock ``read`` holds).

The read is kept in progress for real: the body's file is the read end of a pipe that holds one
byte (the thread has taken it: ``FIONREAD`` is 0) and whose write end stays open.
"""

from __future__ import annotations

import array
import asyncio
import fcntl
import os
import termios
import threading
import time

import pytest

from kura.api.action_lookup import read_all
from kura.core.manifest import Manifest
from kura.storage.artifact import StoredBody
from tests.unit.test_public_load import wait_until

# The write end is closed after this long whatever happens, so a loop blocked by the close
# the test looks for ends (and the test fails) instead of hanging.
RELEASE_SECONDS = 6.0


def unread_bytes(fd: int) -> int:
    buf = array.array("i", [0])
    fcntl.ioctl(fd, termios.FIONREAD, buf)
    return buf[0]


async def test_a_cancelled_read_ends_at_once_and_closes_the_file_after_the_read() -> None:
    r, w = os.pipe()
    manifest = Manifest(
        artifact_id="tree",
        producer="bazel",
        namespace_id="default",
        key="cas/tree",
        content_type="application/octet-stream",
        size=1,
        sha256="0" * 64,
        created_at_ms=1,
        version_ms=1,
    )
    f = os.fdopen(r, "rb")
    body = StoredBody(manifest, file=f, verified=False)
    os.write(w, b"x")
    closed: list[bool] = []
    lock = threading.Lock()

    def end_the_pipe() -> None:
        with lock:
            if not closed:
                closed.append(True)
                os.close(w)

    release = threading.Timer(RELEASE_SECONDS, end_the_pipe)
    release.start()
    try:
        lookup = asyncio.create_task(read_all(body, 1024))
        # Taken: the thread is inside read(), waiting for the end of the file.
        assert await wait_until(lambda: unread_bytes(w) == 0)
        started = time.monotonic()
        lookup.cancel()
        with pytest.raises(asyncio.CancelledError):
            await lookup
        cancelled_s = time.monotonic() - started
        assert cancelled_s < RELEASE_SECONDS / 2, f"the cancel waited {cancelled_s:.1f} s"
        assert not f.closed  # the thread still reads it
    finally:
        release.cancel()
        end_the_pipe()
    assert await wait_until(lambda: f.closed)  # once the read met the end of the pipe
    assert body.file is None
