"""``kura status | head`` and friends: a reader that goes away ends the command quietly.

Python turns SIGPIPE into ``BrokenPipeError``; left alone it prints a traceback (or "Exception
ignored ... BrokenPipeError" at exit) under output the user already cut off.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable

import pytest

from tests.conftest import NodeProcess

pytestmark = pytest.mark.in_process


def run_into_closed_pipe(*argv: str) -> subprocess.CompletedProcess[bytes]:
    """Run ``python -m argv...`` with stdout a pipe whose reader has already closed."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [sys.executable, "-m", *argv], stdout=write_end, stderr=subprocess.PIPE, timeout=60
        )
    finally:
        os.close(write_end)


def test_status_into_a_closed_pipe_prints_no_traceback(
    start_node: Callable[..., NodeProcess],
) -> None:
    node = start_node("pipe")
    for argv in (
        ("kura.cli", "status", "--url", node.url, "--json"),
        ("kura.cli", "status", "--url", node.url),
        ("kura.cli", "--help"),
        ("kured.cli", "--help"),
    ):
        done = run_into_closed_pipe(*argv)
        err = done.stderr.decode()
        assert "Traceback" not in err, (argv, err)
        assert "BrokenPipeError" not in err, (argv, err)
        # 141 = 128 + SIGPIPE, what a shell reports for a writer stopped by its closed pipe.
        assert done.returncode in (0, 141), (argv, done.returncode, err)
