"""Run a host command for ``kured doctor`` (``apt-config``, ``apt-cache``, ``dpkg-query``):
argv without a shell, bounded in time, output captured whole (these print a few hundred KiB at
most). The child inherits the environment, so ``APT_CONFIG`` reaches apt. ``kit.command``
runs it."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from kit import command

DEFAULT_TIMEOUT_SECONDS = 60.0


@dataclasses.dataclass(frozen=True)
class Result:
    """``returncode`` None: the command could not start (``error`` says why) or timed out."""

    returncode: int | None
    stdout: str
    stderr: str
    error: str = ""


async def run(argv: Sequence[str], timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS) -> Result:
    """Run ``argv`` and wait for it. Never raises for the command's own failure."""
    try:
        done = await command.run(argv, timeout_seconds)
    except command.TimedOut:
        return Result(None, "", "", f"{argv[0]} gave no answer within {timeout_seconds:g}s")
    except command.CommandError as exc:
        return Result(None, "", "", str(exc))
    return Result(done.returncode, done.stdout, done.stderr.strip())
