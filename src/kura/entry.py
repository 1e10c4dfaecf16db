"""The ``kura`` command's entry point (``[project.scripts]``): for ``kura serve`` it takes SIGTERM
and SIGINT before anything else is imported.

Importing ``kura.cli`` and what it needs takes a few hundred milliseconds; a SIGTERM sent in
that time met the signal's default action (exit 143, nothing logged: a fresh clone's attack sent
one 0.05 to 0.2 s after the start). Here the signal is only noted (``REQUESTED``); ``kura serve``
honours it once the node runs, and stops gracefully with exit 0. The interpreter's own start,
before this module runs (some tens of milliseconds), is the window that remains. Every other
command keeps the default handlers.
"""

from __future__ import annotations

import signal
import sys

REQUESTED: list[int] = []  # signals that asked ``kura serve`` to stop before its node ran


def note_stop(signum: int, _frame: object) -> None:
    REQUESTED.append(signum)


def main() -> int:
    if sys.argv[1:2] == ["serve"]:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, note_stop)
    from kura.cli import main as cli_main  # after the handlers, on purpose

    return cli_main(stops=REQUESTED)
