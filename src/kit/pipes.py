"""Command-line output into a pipe whose reader went away (``kura status | head``).

Python ignores SIGPIPE, so a write to a closed pipe raises ``BrokenPipeError`` and, unhandled,
prints a traceback under output the user already cut off. ``quiet_broken_pipe`` ends the
command the way a C tool killed by SIGPIPE does: silently, with status 141 (128 + SIGPIPE).
stdout is pointed at /dev/null first so the interpreter's final flush cannot raise again, as the
Python documentation's "Note on SIGPIPE" (library/signal.html) recommends.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable

BROKEN_PIPE_EXIT = 128 + signal.SIGPIPE


def quiet_broken_pipe(command: Callable[[], int]) -> int:
    """Run ``command`` and flush stdout; return its exit status, or 141 if stdout's pipe closed."""
    try:
        try:
            return command()
        finally:  # also on SystemExit (argparse's --help): the flush is where a pipe breaks
            sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return BROKEN_PIPE_EXIT
