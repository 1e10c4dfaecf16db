"""``kura dev --nodes N``: an N-node mesh on 127.0.0.1 for trying replication by hand.

Starts N ``kura serve`` subprocesses with consecutive public ports (BASE, BASE+1, ...) and
internal ports (BASE+100, ...), each with its own data and tmp dirs under ``--dir``, every node
seeded with every other node, then supervises them until Ctrl-C (or SIGTERM) stops them all
gracefully (exit 0). Nodes start through the launcher the tests, bench/ and the demo use
(``kura_harness.launch.node.spawn_kura``): each is listening when its URL is printed; one that
exits before it listens is named with the end of its log and left down.

A node that exits or is killed does not stop the mesh: the supervisor names it on stderr
(``kura dev: node-2 (pid 4242) exited (killed by SIGKILL); ...``) and leaves it down, so the
other nodes queue what it misses. ``kura dev restart N`` (same ``--dir``) asks the supervisor to
start node N again (stopping it first with SIGTERM if it still runs); it then catches up from its
peers (their outboxes, or its pull of their change feeds). The request is a file
``<dir>/control/restart-N`` that the supervisor consumes (polled every 0.2 s);
``<dir>/mesh.json`` names the supervisor's pid and each node's URLs, pid and log, rewritten
whenever a node starts or exits.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kit.wait import wait_until
from kura_harness.launch import LaunchError
from kura_harness.launch.node import spawn_kura
from kura_harness.launch.process import stop

POLL_SECONDS = 0.2
STOP_TIMEOUT_SECONDS = 30.0
RESTART_TIMEOUT_SECONDS = 60.0
MESH_FILE = "mesh.json"
CONTROL_DIR = "control"


def kura_command() -> str:
    """How the user can run this same ``kura`` again from the same directory, for hints."""
    argv0 = Path(sys.argv[0])
    if argv0.name == "kura" and argv0.is_file():
        found = shutil.which("kura")
        if found and Path(found).resolve() == argv0.resolve():
            return "kura"
        return str(argv0)
    return f"{sys.executable} -m kura.cli"


@dataclass
class DevNode:
    number: int  # 1-based, as in node-1
    public_url: str
    internal_url: str
    directory: Path
    env: dict[str, str]
    proc: subprocess.Popen[str] | None = None
    reported: bool = field(default=False)

    @property
    def name(self) -> str:
        return f"node-{self.number}"

    @property
    def log_path(self) -> Path:
        return self.directory / "kura.log"

    def start(self) -> None:
        """Start ``kura serve`` and wait for its listening line (``RESTART_TIMEOUT_SECONDS``);
        a node that exits or times out first is reported on stderr and stays down."""
        self.proc = None
        try:
            self.proc = spawn_kura(self.env, self.log_path, timeout=RESTART_TIMEOUT_SECONDS).proc
        except LaunchError as exc:
            print(f"kura dev: {self.name} did not start: {exc}", file=sys.stderr, flush=True)
        self.reported = False

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after ``STOP_TIMEOUT_SECONDS``."""
        stop(self.proc, signal.SIGTERM, STOP_TIMEOUT_SECONDS)

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "public_url": self.public_url,
            "internal_url": self.internal_url,
            "pid": self.proc.pid if self.running() and self.proc else None,
            "log": str(self.log_path),
        }


def exit_description(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


def _write_mesh_file(root: Path, nodes: list[DevNode]) -> None:
    doc = {"supervisor_pid": os.getpid(), "nodes": [n.describe() for n in nodes]}
    tmp = root / f".{MESH_FILE}.tmp"
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    tmp.replace(root / MESH_FILE)


def _dev_nodes(nodes: int, base_port: int, root: Path) -> list[DevNode]:
    internal = [f"http://127.0.0.1:{base_port + 100 + i}" for i in range(nodes)]
    result = []
    for i in range(nodes):
        node_dir = root / f"node-{i + 1}"
        node_dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.update(
            {
                "KURA_PORT": str(base_port + i),
                "KURA_INTERNAL_PORT": str(base_port + 100 + i),
                "KURA_DATA_DIR": str(node_dir / "data"),
                "KURA_TMP_DIR": str(node_dir / "tmp"),
                "KURA_REGION": f"dev-{i + 1}",
                "KURA_PEERS": ",".join(internal),
            }
        )
        result.append(
            DevNode(i + 1, f"http://127.0.0.1:{base_port + i}", internal[i], node_dir, env)
        )
    return result


def run_dev_mesh(nodes: int, base_port: int, directory: str) -> int:
    if not 1 <= nodes <= 16:
        print("kura dev: --nodes must be between 1 and 16", file=sys.stderr)
        return 2
    root = Path(directory)
    control = root / CONTROL_DIR
    control.mkdir(parents=True, exist_ok=True)
    for stale in control.glob("restart-*"):
        stale.unlink()
    mesh = _dev_nodes(nodes, base_port, root)
    stopping = False

    def stop_mesh(_signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    # Before the nodes start: Ctrl-C while they start stops the ones started, gracefully.
    signal.signal(signal.SIGINT, stop_mesh)
    signal.signal(signal.SIGTERM, stop_mesh)
    for node in mesh:
        node.start()
    _write_mesh_file(root, mesh)
    kura = kura_command()
    print(f"kura dev: {nodes} nodes (logs in {root}/node-N/kura.log)")
    for node in mesh:
        print(f"  {node.name}: {node.public_url}   (internal {node.internal_url})")
    print(f"try:  curl -X PUT --data-binary hello {mesh[0].public_url}/v1/cache/1")
    if nodes > 1:
        print(f"      curl {mesh[1].public_url}/v1/cache/1")
    print(f"      {kura} status --url {mesh[0].public_url}")
    print(f"      {kura} dev restart N --dir {root}   (start node N again after it stopped)")
    print("Ctrl-C stops the mesh.", flush=True)
    while not stopping:
        changed = False
        for node in mesh:
            if node.proc is not None and not node.running() and not node.reported:
                node.reported = changed = True
                print(
                    f"kura dev: {node.name} (pid {node.proc.pid}, {node.public_url}) exited "
                    f"({exit_description(node.proc.returncode)}); the other nodes keep serving. "
                    f"Restart it with: {kura} dev restart {node.number} --dir {root}",
                    file=sys.stderr,
                    flush=True,
                )
        for request in sorted(control.glob("restart-*")):
            wanted = _requested(request, mesh)
            if wanted is not None:
                wanted.stop()
                wanted.start()
                changed = True
                pid = wanted.proc.pid if wanted.proc else "?"
                print(f"kura dev: {wanted.name} restarted (pid {pid})", file=sys.stderr, flush=True)
            request.unlink(missing_ok=True)
        if changed:
            _write_mesh_file(root, mesh)
        time.sleep(POLL_SECONDS)
    for node in mesh:
        if node.running() and node.proc is not None:
            node.proc.send_signal(signal.SIGTERM)
    for node in mesh:
        node.stop()
    return 0


def _requested(request: Path, mesh: list[DevNode]) -> DevNode | None:
    suffix = request.name.removeprefix("restart-")
    for node in mesh:
        if suffix == str(node.number):
            return node
    print(f"kura dev: ignoring {request}: no such node", file=sys.stderr, flush=True)
    return None


def restart_node(number: int, directory: str) -> int:
    """``kura dev restart N``: ask the supervisor of ``directory`` to start node N again.

    Exit 0 once the node answers ``GET /up``; 1 if no supervisor runs there or the node did not
    come back within 60 s; 2 if there is no node N.
    """
    root = Path(directory)
    try:
        doc = json.loads((root / MESH_FILE).read_text())
    except (OSError, ValueError) as exc:
        print(f"kura dev restart: no dev mesh in {root} ({exc})", file=sys.stderr)
        return 1
    if not _alive(int(doc.get("supervisor_pid", 0))):
        print(f"kura dev restart: the `kura dev` of {root} is not running", file=sys.stderr)
        return 1
    nodes = {n["name"]: n for n in doc["nodes"]}
    node = nodes.get(f"node-{number}")
    if node is None:
        print(f"kura dev restart: no node {number} (nodes 1 to {len(nodes)})", file=sys.stderr)
        return 2
    request = root / CONTROL_DIR / f"restart-{number}"
    request.parent.mkdir(parents=True, exist_ok=True)
    request.touch()
    back = wait_until(
        lambda: not request.exists() and _up(node["public_url"]),
        RESTART_TIMEOUT_SECONDS,
        interval=POLL_SECONDS,
    )
    if not back:
        print(f"kura dev restart: node-{number} did not come back", file=sys.stderr)
        return 1
    print(f"node-{number} is serving again on {node['public_url']}")
    return 0


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _up(url: str) -> bool:
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/up", timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False
