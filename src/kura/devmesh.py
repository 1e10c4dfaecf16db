"""``kura dev --nodes N``: an N-node mesh on 127.0.0.1 for trying replication by hand.

Starts N ``kura serve`` subprocesses with consecutive public ports (BASE, BASE+1, ...) and
internal ports (BASE+100, ...), each with its own data and tmp dirs under ``--dir``, every node
seeded with every other node. Prints how to use them, then waits; Ctrl-C (or SIGTERM) stops them
all gracefully. Exit code 1 if a node exits on its own.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def run_dev_mesh(nodes: int, base_port: int, directory: str) -> int:
    if not 1 <= nodes <= 16:
        print("kura dev: --nodes must be between 1 and 16", file=sys.stderr)
        return 2
    root = Path(directory)
    internal = [f"http://127.0.0.1:{base_port + 100 + i}" for i in range(nodes)]
    procs: list[subprocess.Popen[bytes]] = []
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
        log = (node_dir / "kura.log").open("ab")
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "kura.cli", "serve"],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
        log.close()
    print(f"kura dev: {nodes} nodes (logs in {root}/node-N/kura.log)")
    for i in range(nodes):
        print(f"  node-{i + 1}: http://127.0.0.1:{base_port + i}   (internal {internal[i]})")
    print(f"try:  curl -X PUT --data-binary hello http://127.0.0.1:{base_port}/v1/cache/1")
    if nodes > 1:
        print(f"      curl http://127.0.0.1:{base_port + 1}/v1/cache/1")
    print(f"      kura status --url http://127.0.0.1:{base_port}")
    print("Ctrl-C stops the mesh.")
    stopping = False

    def stop(_signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    rc = 0
    while not stopping:
        if any(p.poll() is not None for p in procs):
            print("kura dev: a node exited; stopping the mesh", file=sys.stderr)
            rc = 1
            break
        time.sleep(0.2)
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
    return rc
