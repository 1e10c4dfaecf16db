"""Run a host command for ``kured doctor`` (``apt-config``, ``apt-cache``, ``dpkg-query``):
argv without a shell, bounded in time, output captured whole (these print a few hundred KiB at
most). The child inherits the environment, so ``APT_CONFIG`` reaches apt."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence

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
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
    except OSError as exc:
        return Result(None, "", "", f"{argv[0]} could not start: {exc.strerror or exc}")
    try:
        async with asyncio.timeout(timeout_seconds):
            out, err = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return Result(None, "", "", f"{argv[0]} gave no answer within {timeout_seconds:g}s")
    return Result(
        proc.returncode, out.decode(errors="replace"), err.decode(errors="replace").strip()
    )
