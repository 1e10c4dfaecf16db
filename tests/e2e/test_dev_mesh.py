"""``kura dev --nodes 3`` as a user runs it: a node killed with SIGKILL is named, the other two keep
serving, ``kura dev restart 2`` (the command the supervisor prints) brings it back, it catches up
on what it missed from its peers' outboxes, and ``kura status`` shows it ready and healthy.

The mesh is the real ``kura dev`` process with its three real ``kura serve`` children. ``kura
dev`` takes consecutive ports, so the test looks for a free range (BASE..BASE+2 and
BASE+100..BASE+102) first.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import oneshot
from tests.e2e.mesh import wait_for

NODES = 3
WRITES = 20
TIMEOUT = 90.0


def free_base_port() -> int:
    """A BASE whose public (BASE+i) and internal (BASE+100+i) ports are all free right now."""
    for _ in range(200):
        base = random.randrange(20000, 60000)
        socks = []
        try:
            for port in [base + i for i in range(NODES)] + [base + 100 + i for i in range(NODES)]:
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise AssertionError("no free port range for kura dev")


def kura(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kura.cli", *args], capture_output=True, text=True, timeout=timeout
    )


class DevMesh:
    """The ``kura dev`` process, its output collected as it comes."""

    def __init__(self, directory: Path, base: int) -> None:
        self.directory = directory
        self.urls = [f"http://127.0.0.1:{base + i}" for i in range(NODES)]
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kura.cli",
                "dev",
                "--nodes",
                str(NODES),
                "--base-port",
                str(base),
                "--dir",
                str(directory),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def output(self) -> str:
        return "".join(self.lines)

    def pid(self, number: int) -> int:
        doc = json.loads((self.directory / "mesh.json").read_text())
        pid = doc["nodes"][number - 1]["pid"]
        assert isinstance(pid, int), doc
        return pid

    def status(self, number: int) -> dict[str, object]:
        resp = oneshot.get(self.urls[number - 1] + "/status", timeout=5)
        data: dict[str, object] = resp.json()
        return data

    def ready(self, number: int) -> bool:
        return oneshot.get(self.urls[number - 1] + "/ready", timeout=5).status_code == 200

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            rc = self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self._reader.join(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return rc


@pytest.fixture
def dev_mesh(tmp_path: Path) -> Iterator[DevMesh]:
    mesh = DevMesh(tmp_path / "dev", free_base_port())
    yield mesh
    mesh.stop()


def put(url: str, key: int, body: bytes) -> int:
    return oneshot.put(f"{url}/v1/cache/{key}", content=body, timeout=10).status_code


def test_a_killed_dev_node_is_named_restarted_and_catches_up(dev_mesh: DevMesh) -> None:
    mesh = dev_mesh
    context = mesh.output
    assert wait_for(lambda: all(mesh.ready(n) for n in (1, 2, 3)), TIMEOUT), context()
    for key in range(WRITES):
        assert put(mesh.urls[0], key, b"before %d" % key) == 200
    assert wait_for(lambda: mesh.status(2)["artifacts"] == WRITES, TIMEOUT), mesh.status(2)

    killed = mesh.pid(2)
    os.kill(killed, signal.SIGKILL)
    hint = "dev restart 2 --dir"
    assert wait_for(lambda: hint in mesh.output(), TIMEOUT), context()
    assert f"node-2 (pid {killed}, {mesh.urls[1]}) exited (killed by SIGKILL)" in context()
    assert mesh.proc.poll() is None, "the mesh stopped with its node"

    # The other two keep serving reads and writes while node-2 is down.
    for key in range(WRITES, 2 * WRITES):
        assert put(mesh.urls[0], key, b"during %d" % key) == 200
    for key in range(2 * WRITES):
        assert oneshot.get(f"{mesh.urls[2]}/v1/cache/{key}", timeout=10).status_code == 200
    assert wait_for(lambda: mesh.status(3)["artifacts"] == 2 * WRITES, TIMEOUT)

    restarted = kura("dev", "restart", "2", "--dir", str(mesh.directory), timeout=120)
    assert restarted.returncode == 0, restarted.stderr + context()
    assert f"node-2 is serving again on {mesh.urls[1]}" in restarted.stdout
    assert mesh.pid(2) != killed
    assert "node-2 restarted (pid" in context()

    # Caught up: node-2 holds all it missed, without a single read sent to it.
    assert wait_for(lambda: mesh.status(2)["artifacts"] == 2 * WRITES, TIMEOUT), mesh.status(2)
    assert wait_for(lambda: mesh.ready(2), TIMEOUT), mesh.status(2)
    node2_internal = mesh.status(2)["node_url"]

    def node1_sees_node2_drained() -> bool:
        peers = mesh.status(1)["peers"]
        assert isinstance(peers, list)
        peer = next(p for p in peers if p["node_url"] == node2_internal)
        return bool(peer["healthy"]) and peer["outbox_messages"] == 0

    assert wait_for(node1_sees_node2_drained, TIMEOUT), mesh.status(1)

    shown = kura("status", "--url", mesh.urls[1])
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "ready    yes" in shown.stdout, shown.stdout
    assert f"store    {2 * WRITES} artifacts" in shown.stdout, shown.stdout
    seen = kura("status", "--url", mesh.urls[0])
    row = next(line for line in seen.stdout.splitlines() if str(node2_internal) in line)
    assert "healthy" in row, seen.stdout

    # The hint `kura dev` printed at start-up is a command that works as printed.
    hint_line = next(line for line in mesh.lines if " status --url " in line)
    printed = subprocess.run(
        ["bash", "-c", hint_line.strip()], capture_output=True, text=True, timeout=60
    )
    assert printed.returncode == 0, hint_line + printed.stdout + printed.stderr
    assert "ready    yes" in printed.stdout, printed.stdout

    pids = [mesh.pid(n) for n in (1, 2, 3)]
    assert mesh.stop() == 0, context()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
