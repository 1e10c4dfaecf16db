"""Start a process, wait until it is ready, stop it: the common part of every launcher.

Ports: ``free_port``/``free_ports`` ask the OS for ports (bind port 0, read it, close); the
server binds them a moment later, so another process can take one in between. Launchers that
choose ports this way retry a failed start with new ports (``etcd``), or the caller does.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

START_TIMEOUT_SECONDS = 60.0
LOG_TAIL_CHARS = 3000


class LaunchError(RuntimeError):
    """A process could not be started here: a missing binary, or it exited or timed out before
    it was ready (the message carries the tail of its log)."""


def which(name: str, install_hint: str) -> str:
    """The absolute path of ``name`` on PATH; raises LaunchError naming ``install_hint``."""
    path = shutil.which(name)
    if path is None:
        raise LaunchError(f"`{name}` is not on PATH: {install_hint}")
    return path


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports the OS considers free on 127.0.0.1 right now (all held until all
    are chosen, so they differ)."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def free_port() -> int:
    """One port the OS just handed out (and released) on 127.0.0.1."""
    return free_ports(1)[0]


def http_get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    """(status, body) of a GET; raises OSError when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return int(response.status), bytes(response.read())
    except urllib.error.HTTPError as exc:
        return int(exc.code), bytes(exc.read())
    except urllib.error.URLError as exc:
        raise OSError(str(exc.reason)) from exc


def get_json(url: str, timeout: float = 5.0) -> Any:
    """The JSON body of a 200 answer; raises OSError for another status or no answer and
    ValueError for a body that is not JSON."""
    status, body = http_get(url, timeout)
    if status != 200:
        raise OSError(f"{url} answered {status}")
    return json.loads(body)


def log_tail(path: Path) -> str:
    """The last ``LOG_TAIL_CHARS`` characters of a log file ('' when it does not exist)."""
    try:
        return path.read_text(errors="replace")[-LOG_TAIL_CHARS:]
    except FileNotFoundError:
        return ""


def stop(
    proc: subprocess.Popen[Any] | None,
    sig: int = signal.SIGTERM,
    timeout: float = 30.0,
    group: bool = False,
) -> int | None:
    """Send ``sig`` and wait up to ``timeout`` seconds, then SIGKILL. With ``group`` the signals
    go to the process group (a process started with ``start_new_session``: whatever it started
    goes down with it). Returns the exit code (None for no process); a process that already
    exited is left alone."""
    if proc is None:
        return None
    if proc.poll() is None:
        _signal(proc, sig, group)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            _signal(proc, signal.SIGKILL, group)
            proc.wait()
    return proc.returncode


def _signal(proc: subprocess.Popen[Any], sig: int, group: bool) -> None:
    with contextlib.suppress(ProcessLookupError):
        if group:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)


def wait_until(
    predicate: Callable[[], bool],
    timeout: float,
    proc: subprocess.Popen[Any] | None = None,
    interval: float = 0.05,
) -> bool:
    """Poll ``predicate`` (OSError and ValueError count as False) until it is true (True), or
    ``timeout`` seconds pass or ``proc`` exits (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return False
        with contextlib.suppress(OSError, ValueError):
            if predicate():
                return True
        time.sleep(interval)
    return False


@dataclass
class Started:
    """A process whose stdout printed the line its launcher waited for."""

    proc: subprocess.Popen[str]
    match: re.Match[str]
    # Drains stdout until EOF (so the child never blocks on a full pipe); ends when it exits.
    reader: threading.Thread


def spawn_until_line(
    argv: Sequence[str],
    env: dict[str, str],
    log_path: Path,
    pattern: re.Pattern[str],
    what: str,
    cwd: Path | None = None,
    timeout: float = START_TIMEOUT_SECONDS,
    start_new_session: bool = False,
    log_mode: str = "a",
) -> Started:
    """Start ``argv`` (stderr to ``log_path``, opened with ``log_mode``) and wait up to
    ``timeout`` seconds for a stdout line matching ``pattern``. Raises LaunchError (with the log's
    tail) when it exits or times out first; the process is killed then."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open(log_mode) as log:  # the child keeps its own descriptor
        proc = subprocess.Popen(
            list(argv),
            env=env,
            stdout=subprocess.PIPE,
            stderr=log,
            stdin=subprocess.DEVNULL,
            text=True,
            cwd=cwd,
            start_new_session=start_new_session,
        )
    found: list[re.Match[str]] = []
    done = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                if not found:
                    m = pattern.search(line)
                    if m:
                        found.append(m)
                        done.set()
        finally:
            proc.stdout.close()  # EOF: the process exited
            done.set()

    reader = threading.Thread(target=read, daemon=True, name=f"stdout {what}")
    reader.start()
    done.wait(timeout)
    if not found:
        stop(proc, signal.SIGKILL, group=start_new_session)
        reader.join(5)
        raise LaunchError(f"{what} did not start (rc={proc.returncode}):\n{log_tail(log_path)}")
    return Started(proc, found[0], reader)
