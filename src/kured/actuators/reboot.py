"""Triggering the reboot: a command (argv, no shell) or a signal to PID 1.

* ``CommandReboot`` runs ``--reboot-command`` (default ``/bin/systemctl reboot``). With
  ``host_namespace`` (the agent runs in a container with ``hostPID``) it is entered into the
  host's mount namespace with ``nsenter -m/proc/1/ns/mnt --``, like kured. A launch failure, a
  non-zero exit or the timeout raises ``RebootError``; on a timeout the command and whatever it
  started have been killed and reaped first (``kit.command``).
* ``SignalReboot`` sends ``--reboot-signal`` (default 39, SIGRTMIN+5, which systemd takes as a
  reboot request) to PID 1.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Protocol

from kit import command
from kured.core.errors import RebootError

NSENTER = ("nsenter", "-m/proc/1/ns/mnt", "--")


def in_other_mount_namespace_than_pid1() -> bool:
    """True when this process runs in a container whose PID 1 (seen through hostPID) is the
    host's init: the reboot command must then be entered into the host's namespace."""
    try:
        return os.readlink("/proc/self/ns/mnt") != os.readlink("/proc/1/ns/mnt")
    except OSError:
        return False  # cannot see PID 1's namespace: we are not allowed to enter it either


def wants_host_namespace(setting: str) -> bool:
    """Resolve ``--host-namespace`` (auto, true, false)."""
    if setting == "auto":
        return in_other_mount_namespace_than_pid1()
    return setting == "true"


class Rebooter(Protocol):
    async def reboot(self) -> None:
        """Trigger the reboot; raises ``RebootError``."""
        ...


class CommandReboot:
    def __init__(
        self, argv: Sequence[str], host_namespace: bool = False, timeout_seconds: float = 300
    ) -> None:
        if not argv:
            raise ValueError("empty reboot command")
        self.argv = (*NSENTER, *argv) if host_namespace else tuple(argv)
        self.timeout_seconds = timeout_seconds

    async def reboot(self) -> None:
        shown = " ".join(self.argv)
        try:
            done = await command.run(self.argv, self.timeout_seconds, merge_stderr=True)
        except command.NotStarted as exc:
            raise RebootError(f"reboot command {shown!r} could not start: {exc.__cause__}") from exc
        except command.TimedOut as exc:
            raise RebootError(
                f"reboot command {shown!r} timed out after {self.timeout_seconds:g}s (killed)"
            ) from exc
        if done.returncode != 0:
            tail = done.stdout.strip()[-300:]
            raise RebootError(f"reboot command {shown!r} exited {done.returncode}: {tail}")


class SignalReboot:
    def __init__(self, signal_number: int, pid: int = 1) -> None:
        self.signal_number = signal_number
        self.pid = pid

    async def reboot(self) -> None:
        try:
            os.kill(self.pid, self.signal_number)
        except OSError as exc:
            raise RebootError(
                f"cannot send signal {self.signal_number} to PID {self.pid}: {exc}"
            ) from exc
