"""Is a reboot required? A file, a command, or the running kernel, each answering yes or no.

* ``FileSentinel``: the file exists (kured's default ``/var/run/reboot-required``). Any error
  reading it means "not required", like kured (§2.6).
* ``CommandSentinel``: argv run without a shell (kured lexes the flag the same way). Exit 0 means
  required; any other exit means not required — except 126 and 127 ("cannot execute", "command
  not found") and a failure to launch at all, which raise ``SensorError``. That is our fix for
  kured #976, where ``sh -c "! needs-restarting"`` on a node without the tool turned "command not
  found" into "reboot", once an hour, for two days.
* ``KernelSentinel``: required when a kernel newer than the running one is installed (under
  ``/lib/modules`` or ``/boot/vmlinuz-*``), so a node reboots into its new kernel even when
  nothing writes the sentinel file (the home-lab seed: no package wrote it at all).
* ``AnySentinel``: required if any of its sentinels says so; an error in any is an error.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from kit import command
from kured.core.errors import SensorError


class Sentinel(Protocol):
    async def check(self) -> tuple[bool, str]:
        """(required, human detail). Raises ``SensorError`` when it cannot answer."""
        ...


class FileSentinel:
    def __init__(self, path: Path) -> None:
        self.path = path

    async def check(self) -> tuple[bool, str]:
        try:
            exists = self.path.exists()
        except OSError:
            exists = False
        return exists, f"sentinel file {self.path} {'exists' if exists else 'is absent'}"


class CommandSentinel:
    def __init__(self, argv: Sequence[str], timeout_seconds: float = 60.0) -> None:
        if not argv:
            raise ValueError("empty sentinel command")
        self.argv = tuple(argv)
        self.timeout_seconds = timeout_seconds
        # The exit status of the last run that finished (``kured doctor`` reports it).
        self.last_returncode: int | None = None

    async def check(self) -> tuple[bool, str]:
        shown = " ".join(self.argv)
        try:
            done = await command.run(self.argv, self.timeout_seconds, keep_stdout=False)
        except command.NotStarted as exc:
            raise SensorError(
                f"sentinel command {shown!r} could not start: {exc.__cause__}"
            ) from exc
        except command.TimedOut as exc:
            raise SensorError(f"sentinel command {shown!r} timed out") from exc
        rc = self.last_returncode = done.returncode
        tail = done.stderr.strip()[-200:]
        if rc in (126, 127):
            raise SensorError(f"sentinel command {shown!r} exited {rc} (cannot run): {tail}")
        # What it said on stderr goes with the answer: a negated missing tool (kured #976)
        # exits 0 with "not found" there, and that is the clue an operator needs.
        said = f" (stderr: {tail})" if tail else ""
        if rc == 0:
            return True, f"sentinel command {shown!r} exited 0{said}"
        return False, f"sentinel command {shown!r} exited {rc}{said}"


_VERSION_PART = re.compile(r"(\d+)|([^\d.\-+~]+)")


def kernel_version_key(release: str) -> tuple[tuple[int, str], ...]:
    """Sort key for kernel release strings (``6.12.9-amd64`` < ``6.12.10-amd64``)."""
    return tuple(
        (int(num), "") if num else (-1, word) for num, word in _VERSION_PART.findall(release)
    )


class KernelSentinel:
    def __init__(
        self,
        running: str | None = None,
        modules_dir: Path = Path("/lib/modules"),
        boot_dir: Path = Path("/boot"),
    ) -> None:
        self.running = running or os.uname().release
        self.modules_dir = modules_dir
        self.boot_dir = boot_dir

    def installed(self) -> list[str]:
        found: set[str] = set()
        if self.modules_dir.is_dir():
            found |= {p.name for p in self.modules_dir.iterdir() if p.is_dir()}
        if self.boot_dir.is_dir():
            found |= {p.name[len("vmlinuz-") :] for p in self.boot_dir.glob("vmlinuz-*")}
        return sorted(found, key=kernel_version_key)

    async def check(self) -> tuple[bool, str]:
        try:
            installed = self.installed()
        except OSError as exc:
            raise SensorError(f"cannot list installed kernels: {exc}") from exc
        if not installed:
            return False, "no installed kernels found"
        newest = installed[-1]
        if kernel_version_key(newest) > kernel_version_key(self.running):
            return True, f"running kernel {self.running} is older than installed {newest}"
        return False, f"running kernel {self.running} is the newest installed"


class AnySentinel:
    def __init__(self, sentinels: Sequence[Sentinel]) -> None:
        self.sentinels = tuple(sentinels)

    async def check(self) -> tuple[bool, str]:
        details = []
        for sentinel in self.sentinels:
            required, detail = await sentinel.check()
            if required:
                return True, detail
            details.append(detail)
        return False, "; ".join(details)
