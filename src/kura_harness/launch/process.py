"""Start a process, wait until it is ready, stop it: the common part of every launcher.

Ports: a server that must be told its port before it starts (a mesh node's peers need its
internal URL) gets one from ``free_port``/``free_ports``. They pick ports *below* the kernel's
ephemeral range (``/proc/sys/net/ipv4/ip_local_port_range``) and check with the OS that each is
free right now. The kernel hands out only ephemeral ports to ``bind(port 0)`` and to outgoing
connections, so no other server or client of the run can be given such a port between our check
and the server's bind (a port picked with ``bind(port 0)`` could be: it once was, failing a test
with "Address already in use"). Within one process a port is handed out once; each process starts
at its own random place in the range. Processes of one test run that pick ports side by side
(pytest-xdist's workers, ``PYTEST_XDIST_WORKER=gwN`` of ``PYTEST_XDIST_WORKER_COUNT``) each pick
from their own slice of it (``worker_slice``): two of them once handed the same port to two
servers, both checked free before either bound it. Where the range cannot be read, they fall back to
``bind(port 0)``, and launchers that choose ports retry a failed start with new ports (``etcd``).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kit.wait import wait_until

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


PORT_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_handed_out: set[int] = set()
_cursor: list[int] = []  # the next candidate, once chosen
_pick_lock = threading.Lock()


def reserved_port_range(range_file: Path = PORT_RANGE_FILE) -> range:
    """The ports ``free_ports`` picks from: the half of the ports below the ephemeral range's
    start, never below 1024 (16384-32767 with Linux's default 32768-60999). Empty when
    ``range_file`` cannot be read or leaves no room."""
    try:
        low = int(range_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return range(0)
    return range(max(1024, low // 2), low)


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def worker_slice(pool: range, environ: Mapping[str, str] = os.environ) -> range:
    """The part of ``pool`` this process picks from: the N-th of K equal slices for the N-th of
    K test-run workers (``PYTEST_XDIST_WORKER=gwN``, ``PYTEST_XDIST_WORKER_COUNT=K``), else all
    of it. Slices never overlap, so no two workers hand out one port."""
    worker, count = environ.get("PYTEST_XDIST_WORKER", ""), environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not (worker.startswith("gw") and worker[2:].isdigit() and count and count.isdigit()):
        return pool
    index, slices = int(worker[2:]), int(count)
    if not 0 <= index < slices:
        return pool
    size = len(pool) // slices
    return pool[index * size : (index + 1) * size]


def free_ports(count: int, candidates: range | None = None) -> list[int]:
    """``count`` distinct ports on 127.0.0.1 that the OS reports free now and that this process has
    not handed out before, from ``candidates`` (default: this worker's slice of
    ``reserved_port_range()``; see the module's docstring for why). Raises OSError when the
    range has too few free ports."""
    pool = worker_slice(reserved_port_range()) if candidates is None else candidates
    if not pool:
        return _os_chosen_ports(count)
    chosen: list[int] = []
    with _pick_lock:
        if not _cursor:
            _cursor.append(random.SystemRandom().randrange(len(pool)))
        for _ in range(len(pool)):
            port = pool[_cursor[0] % len(pool)]
            _cursor[0] += 1
            if port not in _handed_out and _bindable(port):
                _handed_out.add(port)
                chosen.append(port)
                if len(chosen) == count:
                    return chosen
    raise OSError(f"only {len(chosen)} of {count} ports free in {pool.start}-{pool.stop - 1}")


def _os_chosen_ports(count: int) -> list[int]:
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
    """One port from ``free_ports``."""
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


def spawn_until_ready(
    argv: Sequence[str], log_path: Path, ready_url: str, timeout: float, what: str
) -> subprocess.Popen[bytes]:
    """Start ``argv`` (output appended to ``log_path``) and wait until ``ready_url`` answers
    200, polling every 0.2 s: the one starter of the Debian servers the tests run (Prometheus,
    Alertmanager). Raises LaunchError, naming ``what`` and the log's tail, when the process
    exits first or ``timeout`` seconds pass (the process is then stopped)."""
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            list(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    ready = wait_until(
        lambda: http_get(ready_url, 2)[0] == 200,
        timeout,
        interval=0.2,
        ignoring=(OSError, ValueError),
        give_up=lambda: proc.poll() is not None,
    )
    if not ready:
        stop(proc)
        raise LaunchError(f"{what} did not become ready:\n" + log_tail(log_path))
    return proc


def _signal(proc: subprocess.Popen[Any], sig: int, group: bool) -> None:
    with contextlib.suppress(ProcessLookupError):
        if group:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)


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
