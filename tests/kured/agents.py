"""Helpers to run real ``kured`` agent processes in tests, with a reboot that restarts them,
and ``wired_agent``: the same agent built in-process from kured's flags on virtual time.

A "host" is a directory with a sentinel file and a state dir. Its reboot command is
``reboot.sh``: it appends ``<unix time> <node> reboot`` to the shared event log, deletes the
sentinel (as a boot clears /var/run), writes a new boot ID (as the kernel does at every boot)
and kills the agent (its parent), as the machine going down would. The ``Host`` supervisor then starts the agent again, as a boot would.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from kit.clock import ManualClock
from kura_harness.launch.node import spawn_kured
from kura_harness.rolling.observe import read_events
from kured.app import AgentService
from kured.loop import Agent
from kured.settings import add_arguments, load_settings
from tests import oneshot
from tests.kured.kube_agent import FakeReboot

__all__ = ["NO_ETCD", "Host", "Wired", "lease_host", "read_events", "released_at", "wired_agent"]


REBOOT_SCRIPT = """#!/bin/sh
# Test reboot: record, clear the sentinel, take the agent down like a power cycle would.
echo "$(date +%s.%N) $1 reboot" >> "$2"
rm -f "$3"
cat /proc/sys/kernel/random/uuid > "$4"
kill -9 $PPID
"""


class Host:
    """One machine: a kured agent process, restarted whenever it dies ("boots")."""

    def __init__(
        self, root: Path, node: str, etcd: str, events: Path, *extra: str, lock_key: str = ""
    ) -> None:
        """``lock_key``: ``--lock-key`` (a test's own in the shared etcd); kured's default if
        empty."""
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
        self.argv = [  # kured's flags
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
            *(["--lock-key", lock_key] if lock_key else []),
            *extra,
        ]
        self.url = ""
        self.boots = 0
        self.proc: subprocess.Popen[str] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._supervise, daemon=True)
        self.log_path = self.dir / "kured.log"

    def _start(self) -> None:
        # Its own process group: the reboot script dies with it.
        self.proc, self.url = spawn_kured(
            self.argv, self.log_path, start_new_session=True, what=f"kured {self.node}"
        )
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
        return oneshot.get(self.url + "/status", timeout=10).json()  # type: ignore[no-any-return]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


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


@dataclass
class Wired:
    """An in-process agent (``wired_agent``), its sentinel file and its reboot."""

    agent: Agent
    sentinel: Path
    rebooter: FakeReboot
    clock: ManualClock

    async def check(self, times: int = 1) -> list[str]:
        """``times`` checks one ``--period`` apart on the virtual clock (the first now): each
        check's decision, as ``action: reason``."""
        said = []
        for i in range(times):
            if i:
                await self.clock.sleep(self.agent.config.period_seconds)
            decision = await self.agent.tick()
            said.append(f"{decision.action.value}: {decision.why.value}")
        return said


@contextlib.asynccontextmanager
async def wired_agent(
    root: Path, node: str, *flags: str, clock: ManualClock | None = None
) -> AsyncIterator[Wired]:
    """The agent ``kured`` would run with ``flags`` (``kured.app.AgentService.build_agent``:
    the same lock, gates, sentinel and node wiring), in this event loop, on ``clock`` (a fresh
    ``ManualClock`` at the real time by default), recovered and not yet checked. Its reboot is
    a ``FakeReboot`` (records, clears the sentinel, writes a new boot ID); ``--node-id``, the
    sentinel, the boot ID file and the state dir are set under ``root/node``."""
    home = root / node
    home.mkdir(parents=True, exist_ok=True)
    sentinel, boot_id = home / "reboot-required", home / "boot_id"
    boot_id.write_text(f"{uuid.uuid4()}\n")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    argv = ["--node-id", node, "--reboot-sentinel", str(sentinel), "--boot-id-file", str(boot_id)]
    argv += ["--state-dir", str(home / "state"), *flags]
    clock = clock or ManualClock(now_ms=int(time.time() * 1000))
    service = AgentService(load_settings(parser.parse_args(argv), {}), clock)
    rebooter = FakeReboot(sentinel, boot_id)
    async with aiohttp.ClientSession() as session:
        agent = service.build_agent(session)
        agent.rebooter = rebooter
        try:
            await agent.recover()
            yield Wired(agent, sentinel, rebooter, clock)
        finally:
            close = getattr(service.lock, "close", None)
            if close is not None:
                await close()
            if service.api is not None:
                await service.api.close()


NO_ETCD = "http://127.0.0.1:9"  # the lease backend never uses it


def lease_host(root: Path, kubeconfig: Path, *flags: str, node: str = "n1") -> Host:
    """A ``Host`` for ``node`` on the Lease lock of the Kubernetes double at ``kubeconfig``
    (no etcd), its events in ``root / "events"``; ``flags`` are further kured flags."""
    return Host(
        root,
        node,
        NO_ETCD,
        root / "events",
        "--lock-backend",
        "lease",
        "--kubeconfig",
        str(kubeconfig),
        *flags,
    )
