"""Run a command (argv, no shell) with a timeout, and never leave its processes behind.

``run`` starts the child in its own session (so its own process group), captures its output
whole, and waits for it. When the timeout runs out, or the caller is cancelled, it SIGKILLs the
whole process group (the child and whatever it started: a ``sh`` script's ``sleep``, a
``nsenter``'s command) and reaps the child before it returns: no zombie, no orphan holding the
pipes open. Killing only the direct child and not waiting for it is what this replaces.

The one runner of kured's host commands (the reboot command, the sentinel command, the hook
commands, ``kured doctor``'s apt and dpkg queries). Callers translate its two errors into their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
from collections.abc import Mapping, Sequence

__all__ = ["CommandError", "Completed", "NotStarted", "TimedOut", "run"]


class CommandError(Exception):
    """A command that did not complete; ``str(exc)`` says why, naming ``argv[0]``."""


class NotStarted(CommandError):
    """The command could not start (not found, not executable, no resources)."""


class TimedOut(CommandError):
    """The command ran out of time; it and its process group were killed, it was reaped."""


@dataclasses.dataclass(frozen=True)
class Completed:
    """A command that exited: its exit status (negative: killed by that signal, as
    ``subprocess`` reports it) and its output, decoded with ``errors="replace"``. ``stderr`` is
    ``""`` when it was merged into ``stdout``."""

    returncode: int
    stdout: str
    stderr: str


async def run(
    argv: Sequence[str],
    timeout_seconds: float | None,
    *,
    merge_stderr: bool = False,
    keep_stdout: bool = True,
    input: bytes | None = None,
    env: Mapping[str, str] | None = None,
    tail_bytes: int | None = None,
) -> Completed:
    """Run ``argv`` and wait for it, at most ``timeout_seconds`` (None: no bound).
    ``merge_stderr``: stderr goes into ``stdout``; ``keep_stdout=False``: stdout goes to
    /dev/null. ``input``: written to its stdin (else stdin is /dev/null). ``env``: its whole
    environment (else the environment is inherited). ``tail_bytes``: of its output only the last
    that many bytes are kept, read as it comes (a command printing gigabytes costs that much).

    Raises ``NotStarted`` when the command cannot start and ``TimedOut`` when it ran out of
    time: by then its process group has been killed and the child reaped. A cancelled caller
    kills and reaps the same way before the cancellation propagates. (Not ``OSError`` and
    ``TimeoutError``: the second is a subclass of the first.)
    """
    pipe = asyncio.subprocess.PIPE
    spawn = asyncio.ensure_future(
        asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL if input is None else pipe,
            stdout=pipe if keep_stdout else asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.STDOUT if merge_stderr else pipe,
            start_new_session=True,
            env=None if env is None else dict(env),
        )
    )
    try:
        # Shielded: the child runs (and may have started children of its own) before its pipes
        # are connected. A caller cancelled meanwhile would let asyncio kill the child alone
        # and leave its process group running; here the spawn finishes and the group is killed.
        proc = await asyncio.shield(spawn)
    except OSError as exc:
        raise NotStarted(f"{argv[0]} could not start: {exc.strerror or exc}") from exc
    except asyncio.CancelledError:
        with contextlib.suppress(OSError):  # it did not start: nothing to kill
            await _kill_and_reap(await spawn)
        raise
    try:
        async with asyncio.timeout(timeout_seconds):
            if tail_bytes is None:
                out, err = await proc.communicate(input)
            else:
                out, err, _ = await asyncio.gather(
                    _tail(proc.stdout, tail_bytes),
                    _tail(proc.stderr, tail_bytes),
                    _feed(proc, input),
                )
                await proc.wait()
    except TimeoutError as exc:
        await _kill_and_reap(proc)
        raise TimedOut(f"{argv[0]} gave no answer within {timeout_seconds:g}s (killed)") from exc
    except BaseException:  # the caller was cancelled: nothing may outlive it
        await _kill_and_reap(proc)
        raise
    assert proc.returncode is not None  # communicate() returns once the child has exited
    return Completed(
        proc.returncode,
        (out or b"").decode(errors="replace"),
        (err or b"").decode(errors="replace"),
    )


async def _tail(stream: asyncio.StreamReader | None, limit: int) -> bytes:
    """The last ``limit`` bytes of ``stream``, read to its end."""
    if stream is None:
        return b""
    kept = bytearray()
    while chunk := await stream.read(1 << 16):
        kept += chunk
        if len(kept) > limit:
            del kept[:-limit]
    return bytes(kept)


async def _feed(proc: asyncio.subprocess.Process, data: bytes | None) -> None:
    """Write ``data`` to the child's stdin and close it (a child that does not read it is no
    error)."""
    if proc.stdin is None:
        return
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        if data:
            proc.stdin.write(data)
            await proc.stdin.drain()
        proc.stdin.close()


async def _kill_and_reap(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL the child's process group (its session, started by ``run``) and wait for the
    child. The wait is shielded: a second cancellation cannot leave a zombie behind."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()  # the group is gone only if the child already exited: harmless then
    await asyncio.shield(proc.wait())
