"""Helpers to run real ``kured`` agent processes in tests, with a reboot that restarts them.

A "host" is a directory with a sentinel file and a state dir. Its reboot command is
``reboot.sh``: it appends ``<unix time> <node> reboot`` to the shared event log, deletes the
sentinel (as a boot clears /var/run), writes a new boot ID (as the kernel does at every boot)
and kills the agent (its parent), as the machine going down would. The ``Host`` supervisor then starts the agent again, as a boot would.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

LISTEN = re.compile(r"kured listening metrics=(http://\S+)")

REBOOT_SCRIPT = """#!/bin/sh
# Test reboot: record, clear the sentinel, take the agent down like a power cycle would.
echo "$(date +%s.%N) $1 reboot" >> "$2"
rm -f "$3"
cat /proc/sys/kernel/random/uuid > "$4"
kill -9 $PPID
"""


class Host:
    """One machine: a kured agent process, restarted whenever it dies ("boots")."""

    def __init__(self, root: Path, node: str, etcd: str, events: Path, *extra: str) -> None:
        self.node = node
        self.dir = root / node
        self.dir.mkdir(parents=True, exist_ok=True)
        self.sentinel = self.dir / "reboot-required"
        self.events = events
        self.boot_id = self.dir / "boot_id"
        self.boot_id.write_text(Path("/proc/sys/kernel/random/uuid").read_text())
        script = root / "reboot.sh"
        if not script.exists():
            script.write_text(REBOOT_SCRIPT)
            script.chmod(0o755)
        self.argv = [
            sys.executable,
            "-m",
            "kured.cli",
            "--node-id",
            node,
            "--etcd-endpoints",
            etcd,
            "--reboot-sentinel",
            str(self.sentinel),
            "--reboot-command",
            f"{script} {node} {events} {self.sentinel} {self.boot_id}",
            "--boot-id-file",
            str(self.boot_id),
            "--state-dir",
            str(self.dir / "state"),
            "--metrics-port",
            "0",
            "--metrics-host",
            "127.0.0.1",
            *extra,
        ]
        self.url = ""
        self.boots = 0
        self.proc: subprocess.Popen[str] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._supervise, daemon=True)
        self.log_path = self.dir / "kured.log"

    def _start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("KURED_")}
        log = self.log_path.open("a")
        self.proc = subprocess.Popen(
            self.argv,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env=env,
            start_new_session=True,  # its own process group: the reboot script dies with it
        )
        log.close()
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        self.proc.stdout.close()  # the agent prints nothing else on stdout (logs go to stderr)
        m = LISTEN.search(line)
        if m is None:
            self.proc.wait(5)
            raise RuntimeError(f"kured {self.node} did not start: {self.log_path.read_text()}")
        self.url = m.group(1)
        self.boots += 1
        with self.events.open("a") as f:
            f.write(f"{time.time():.6f} {self.node} boot\n")

    def _supervise(self) -> None:
        while not self._stop.is_set():
            assert self.proc is not None
            while self.proc.poll() is None:
                if self._stop.wait(0.05):
                    return
            if self._stop.is_set():
                return
            self._start()

    def start(self) -> Host:
        self._start()
        self._thread.start()
        return self

    def kill(self) -> None:
        """SIGKILL the agent and do not restart it (a node that never comes back)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        self._kill_group(signal.SIGKILL)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._kill_group(signal.SIGKILL)  # whatever the agent started (a hung reboot script)

    def _kill_group(self, sig: int) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)
        self.proc.wait()

    def status(self) -> dict[str, object]:
        return httpx.get(self.url + "/status", timeout=10).json()  # type: ignore[no-any-return]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def read_events(path: Path) -> list[tuple[float, str, str]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        t, node, what = line.split()
        out.append((float(t), node, what))
    return sorted(out)


LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}) ")


def released_at(log: str) -> list[float]:
    """Unix times of every 'lock released' line in an agent log."""
    import datetime as dt

    times = []
    for line in log.splitlines():
        if "lock released by" in line:
            m = LOG_TIME.match(line)
            if m:
                stamp = dt.datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S.%f")
                times.append(stamp.astimezone().timestamp())
    return times
