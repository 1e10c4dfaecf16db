"""A real ``kura serve`` process and a real ``kured`` agent process.

Both print one line on stdout once they listen (``kura listening public=URL internal=URL``,
``kured listening metrics=URL``); the launchers wait for it, so a returned process accepts
connections. Settings go in through the environment (``KURA_*``) or argv (kured flags).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from kura_harness.launch.process import START_TIMEOUT_SECONDS, spawn_until_line, stop

KURA_LISTEN = re.compile(r"kura listening public=(https?://\S+) internal=(https?://\S+)")
KURED_LISTEN = re.compile(r"kured listening metrics=(http://\S+)")
FLEETLOCK_LISTEN = re.compile(r"kured fleetlock listening (http://\S+)")


def kura_env(
    data_dir: Path,
    tmp_dir: Path,
    settings: Mapping[str, object] | None = None,
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment of a node: ``base`` (default ``os.environ``) without any ``KURA_*``,
    an OS-chosen public port, the two dirs, no free-disk floor, INFO logs, then ``settings``
    as ``KURA_<NAME upper>`` (``{"peers": ...}`` -> ``KURA_PEERS``)."""
    env = {k: v for k, v in (base or os.environ).items() if not k.startswith("KURA_")}
    env.update(
        {
            "KURA_PORT": "0",
            "KURA_DATA_DIR": str(data_dir),
            "KURA_TMP_DIR": str(tmp_dir),
            "KURA_MIN_FREE_DISK_BYTES": "0",
            "KURA_LOG_LEVEL": "INFO",
        }
    )
    for key, value in (settings or {}).items():
        env["KURA_" + key.upper()] = str(value)
    return env


@dataclass
class KuraProcess:
    """A ``kura serve`` that printed its listening line."""

    proc: subprocess.Popen[str]
    url: str  # public
    internal_url: str
    log_path: Path
    reader: threading.Thread

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0, group: bool = False) -> int:
        """Signal it, wait up to ``timeout`` s (then SIGKILL); its exit code."""
        rc = stop(self.proc, sig, timeout, group)
        self.reader.join(5)
        assert rc is not None
        return rc


def spawn_kura(
    env: dict[str, str],
    log_path: Path,
    cwd: Path | None = None,
    prefix: Sequence[str] = (),
    timeout: float = START_TIMEOUT_SECONDS,
    start_new_session: bool = False,
    log_mode: str = "a",
    command: Sequence[str] = (),
) -> KuraProcess:
    """Start ``kura serve`` (under the command ``prefix``, e.g. a faketime wrapper) with ``env``
    and wait for its listening line; raises LaunchError when it exits or times out first.

    ``command`` runs another ``kura`` (bench/ runs an installed one, or another revision's):
    ``serve`` is appended to it; by default this interpreter's ``-m kura.cli``. The one
    launcher of ``kura serve`` for the tests, bench/, the demo and ``kura dev``."""
    started = spawn_until_line(
        [*prefix, *(command or (sys.executable, "-m", "kura.cli")), "serve"],
        env,
        log_path,
        KURA_LISTEN,
        f"kura under {cwd or log_path.parent}",
        cwd=cwd,
        timeout=timeout,
        start_new_session=start_new_session,
        log_mode=log_mode,
    )
    m = started.match
    return KuraProcess(started.proc, m.group(1), m.group(2), log_path, started.reader)


def kured_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default ``os.environ``) without any ``KURED_*``: flags alone configure it."""
    return {k: v for k, v in (base or os.environ).items() if not k.startswith("KURED_")}


def spawn_kured(
    flags: Sequence[str],
    log_path: Path,
    env: dict[str, str] | None = None,
    timeout: float = START_TIMEOUT_SECONDS,
    start_new_session: bool = False,
    what: str = "kured",
) -> tuple[subprocess.Popen[str], str]:
    """Start a ``kured`` agent with ``flags`` (stderr appended to ``log_path``) and wait for its
    listening line; (process, metrics URL). Raises LaunchError when it exits or times out.
    ``flags`` starting with ``fleetlock`` start the FleetLock server instead; the URL is then
    the one it serves."""
    fleetlock = bool(flags) and flags[0] == "fleetlock"
    started = spawn_until_line(
        [sys.executable, "-m", "kured.cli", *flags],
        kured_env() if env is None else env,
        log_path,
        FLEETLOCK_LISTEN if fleetlock else KURED_LISTEN,
        what,
        timeout=timeout,
        start_new_session=start_new_session,
    )
    return started.proc, started.match.group(1)
