"""Cost of an anti-entropy round (issue 11, deliverable 3) between two nodes holding N keys.

Builds one index of N small inline artifacts directly in SQLite (fast: one transaction; the
range digests are back-filled when the node opens it, which is timed too), copies it into two
data dirs, starts two real ``kura serve`` processes on them and reads a round's cost from
``/status`` (``anti_entropy.last_round``). (Divergence made before start-up is repaired by
bootstrap, not anti-entropy; the repair path's cost is shown by ``tests/e2e/test_anti_entropy.py``.)

Usage::

    .venv/bin/python bench/anti_entropy.py --keys 1000000

Prints one JSON line: keys, start-up seconds (digest back-fill included), and an equal
round's requests, bytes, seconds, ranges mismatched and items repaired.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import signal
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.replication import free_port, start_node
from kit.wait import wait_until
from kura.core.keys import artifact_id
from kura.storage.index import MetadataIndex


def build_index(path: Path, keys: int) -> None:
    MetadataIndex(path).close_thread_connection()  # schema (and an empty digest table)
    conn = sqlite3.connect(path)
    conn.execute("BEGIN")
    now = int(time.time() * 1000)
    rows = []
    for i in range(keys):
        key = f"k{i}"
        body = key.encode()
        rows.append(
            (
                artifact_id("xcode", "default", "bench", key),
                "xcode",
                "bench",
                key,
                "application/octet-stream",
                len(body),
                hashlib.sha256(body).hexdigest(),
                now - keys + i,
                now - keys + i,
                now,
                body,
            )
        )
        if len(rows) == 50_000:
            _insert(conn, rows)
            rows = []
    _insert(conn, rows)
    conn.execute("COMMIT")
    conn.close()


def _insert(conn: sqlite3.Connection, rows: list[tuple[object, ...]]) -> None:
    conn.executemany(
        "INSERT INTO artifacts (artifact_id, producer, namespace_id, key, content_type, size, "
        "sha256, version_ms, created_at_ms, last_access_ms, inline_body) "
        "VALUES (?,?,?,?,?,?,?,?,?,?,?)",
        rows,
    )


class Node:
    def __init__(self, root: Path, port: int, peers: list[str], rps: int) -> None:
        settings = {
            "KURA_ANTI_ENTROPY_INTERVAL": "1s",
            "KURA_ANTI_ENTROPY_MAX_REQUESTS_PER_SECOND": str(rps),
            "KURA_ANTI_ENTROPY_MAX_REQUESTS_PER_ROUND": "100000",
            # A full bootstrap walks the peer's whole dataset before /ready, which at 1 M keys
            # takes longer than this benchmark should: cut it short (its first pass stalls at
            # once and stops gating readiness) so rounds start at once.
            "KURA_BOOTSTRAP_TIMEOUT_MS": "1",
            "KURA_BOOTSTRAP_MAX_FAILED_PASSES": "1",
        }
        started = time.monotonic()
        self.proc, self.url = start_node(root, port, peers, settings)
        self.open_seconds = time.monotonic() - started  # to the listening line
        self.internal_url = f"http://127.0.0.1:{port}"

    def ae(self) -> dict[str, Any]:
        return httpx.get(self.url + "/status", timeout=30).json()["anti_entropy"]  # type: ignore[no-any-return]

    def wait_rounds(self, n: int, timeout: float = 600) -> dict[str, Any]:
        start = self.ae()["rounds"]
        seen: dict[str, Any] = {}

        def rounds_done() -> bool:
            seen.update(self.ae())
            return bool(seen["rounds"] >= start + n)

        if wait_until(rounds_done, timeout, interval=0.2):
            return seen
        raise TimeoutError("no anti-entropy round")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)


def time_requests(base: str, repeat: int = 20) -> dict[str, dict[str, float]]:
    """p50 milliseconds and response bytes of each kind of anti-entropy request, from a client
    on loopback (what a descent into a mismatched range costs per step)."""
    cases = {
        "root digest": ("/digests", {"prefix": "", "depth": "0"}),
        "256 child digests of the root": ("/digests", {"prefix": "", "depth": "2"}),
        "256 child digests of a 2-digit range": ("/digests", {"prefix": "ab", "depth": "2"}),
        "listing of a 4-digit range": ("/range", {"prefix": "abcd"}),
    }
    out = {}
    with httpx.Client(timeout=30) as client:
        for name, (path, params) in cases.items():
            times, size = [], 0
            for _ in range(repeat):
                started = time.perf_counter()
                response = client.get(base + path, params=params)
                times.append(time.perf_counter() - started)
                size = len(response.content)
            out[name] = {"p50_ms": round(1000 * statistics.median(times), 2), "bytes": size}
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keys", type=int, default=200_000)
    ap.add_argument("--rps", type=int, default=1000)
    args = ap.parse_args()
    # A SIGTERM (``timeout``) must still stop the two nodes (they run in their own sessions).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    with tempfile.TemporaryDirectory(prefix="kura-ae-bench-") as tmp:
        root = Path(tmp)
        built = time.monotonic()
        (root / "a/data").mkdir(parents=True)
        build_index(root / "a/data/index.sqlite3", args.keys)
        build_seconds = time.monotonic() - built
        shutil.copytree(root / "a", root / "b")
        ports = [free_port(), free_port()]
        peers = [f"http://127.0.0.1:{p}" for p in ports]
        a = Node(root / "a", ports[0], peers, args.rps)
        b = Node(root / "b", ports[1], peers, args.rps)
        try:
            out: dict[str, Any] = {
                "keys": args.keys,
                "build_seconds": round(build_seconds, 1),
                "open_seconds_with_digest_backfill": round(a.open_seconds, 2),
            }
            b.wait_rounds(1, timeout=1500)
            steady = b.wait_rounds(2, timeout=60)
            out["equal_round"] = steady["last_round"] | {"seconds": steady["last_round_seconds"]}
            out["requests_served"] = time_requests(a.internal_url + "/_internal/anti_entropy")
            print(json.dumps(out))
        finally:
            a.stop()
            b.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
