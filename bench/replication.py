"""Replication lag and the throughput cost of replication, on loopback.

Starts real ``kura serve`` processes. Two measurements, each with 1 KiB and 1 MiB artifacts:

* **lag**: a 3-node mesh (A, B, C). A writer PUTs to A at a fixed rate for ``--duration``
  seconds; as soon as each PUT is acknowledged, a watcher polls C (every 2 ms) until the
  artifact is readable there. Lag = time from A's acknowledgement to C's first 200. Reports
  p50, p99 and max.
* **cost**: PUT throughput (``--concurrency`` writers as fast as they can, ``--duration``
  seconds) against a lone node, then against node A of a 3-node mesh, and the ratio
  mesh / single.

Usage::

    .venv/bin/python bench/replication.py                # full run (about 2 minutes)
    .venv/bin/python bench/replication.py --quick        # smoke run

Results are printed as a Markdown table and one JSON line per case (``--json-out``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from kit.wait import wait_until_async
from kura_harness.launch.node import kura_env, spawn_kura
from kura_harness.launch.process import free_port, stop

__all__ = ["Cluster", "free_port", "percentile", "start_node", "stop_node"]


async def ready_200(session: aiohttp.ClientSession, url: str) -> bool:
    """Whether ``url`` answers 200 on /ready now (a probe for ``kit.wait.wait_until_async``)."""
    async with session.get(url + "/ready") as r:
        return r.status == 200


def start_node(
    root: Path, internal_port: int, peers: list[str], extra_env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[str], str]:
    """Start one ``kura serve`` with its data under ``root`` (its log in ``root/kura.log``), in
    its own process group; return the process and its public URL. ``peers`` are internal URLs
    (``KURA_PEERS``)."""
    settings = {
        "internal_port": internal_port,
        "node_url": f"http://127.0.0.1:{internal_port}",
        "peers": ",".join(peers),
        "discovery_settle_ms": 0,
        "log_level": "WARNING",
    }
    env = kura_env(root / "data", root / "tmp", settings)
    env.update(extra_env or {})
    node = spawn_kura(env, root / "kura.log", start_new_session=True)
    return node.proc, node.url


def stop_node(proc: subprocess.Popen[str], sig: int = signal.SIGTERM) -> None:
    stop(proc, sig, timeout=60, group=True)


class Cluster:
    """N kura processes, each seeded with all internal URLs."""

    def __init__(self, root: Path, n: int) -> None:
        ports = [free_port() for _ in range(n)]
        internal = [f"http://127.0.0.1:{p}" for p in ports]
        self.procs: list[subprocess.Popen[str]] = []
        self.urls: list[str] = []
        for i in range(n):
            proc, url = start_node(root / f"n{i}", ports[i], internal if n > 1 else [])
            self.procs.append(proc)
            self.urls.append(url)

    async def wait_ready(self, session: aiohttp.ClientSession, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        for url in self.urls:
            left = deadline - time.monotonic()
            if not await wait_until_async(lambda u=url: ready_200(session, u), left, interval=0.1):
                raise RuntimeError(f"{url} not ready")

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            stop(p, timeout=30, group=True)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(q * (len(ordered) - 1))))
    return ordered[k]


async def measure_lag(
    root: Path, size: int, rate_per_s: float, duration_s: float
) -> dict[str, object]:
    cluster = Cluster(root, 3)
    lags: list[float] = []
    errors = 0
    try:
        async with aiohttp.ClientSession() as session:
            await cluster.wait_ready(session)
            a, _b, c = cluster.urls
            body = os.urandom(size)
            watchers: list[asyncio.Task[None]] = []

            async def watch(key: str, acked: float) -> None:
                nonlocal errors
                deadline = acked + 30
                while time.perf_counter() < deadline:
                    async with session.head(f"{c}/cache/lag/{key}") as r:
                        if r.status == 200:
                            lags.append(time.perf_counter() - acked)
                            return
                    await asyncio.sleep(0.002)
                errors += 1

            start = time.perf_counter()
            i = 0
            while time.perf_counter() - start < duration_s:
                key = f"{size}-{i}"
                payload = body[:-8] + i.to_bytes(8, "big")
                async with session.put(f"{a}/cache/lag/{key}", data=payload) as r:
                    if r.status // 100 != 2:
                        errors += 1
                acked = time.perf_counter()
                watchers.append(asyncio.create_task(watch(key, acked)))
                i += 1
                next_at = start + i / rate_per_s
                await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
            await asyncio.gather(*watchers)
    finally:
        cluster.stop()
    return {
        "case": "lag",
        "size": size,
        "writes": len(lags) + errors,
        "rate_per_s": rate_per_s,
        "p50_ms": round(percentile(lags, 0.5) * 1000, 1) if lags else None,
        "p99_ms": round(percentile(lags, 0.99) * 1000, 1) if lags else None,
        "max_ms": round(max(lags) * 1000, 1) if lags else None,
        "mean_ms": round(statistics.fmean(lags) * 1000, 1) if lags else None,
        "errors": errors,
    }


async def put_throughput(url: str, size: int, concurrency: int, duration_s: float) -> float:
    body = os.urandom(size)
    done = 0
    stop_at = time.perf_counter() + duration_s
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:

        async def writer(w: int) -> None:
            nonlocal done
            i = 0
            while time.perf_counter() < stop_at:
                payload = body[:-12] + w.to_bytes(4, "big") + i.to_bytes(8, "big")
                async with session.put(f"{url}/cache/tput/{w}-{i}", data=payload) as r:
                    if r.status // 100 == 2:
                        done += 1
                i += 1

        start = time.perf_counter()
        await asyncio.gather(*(writer(w) for w in range(concurrency)))
        elapsed = time.perf_counter() - start
    return done / elapsed


async def measure_cost(
    root: Path, size: int, concurrency: int, duration_s: float
) -> dict[str, object]:
    single = Cluster(root / "single", 1)
    try:
        async with aiohttp.ClientSession() as s:
            await single.wait_ready(s)
        single_rps = await put_throughput(single.urls[0], size, concurrency, duration_s)
    finally:
        single.stop()
    mesh = Cluster(root / "mesh", 3)
    try:
        async with aiohttp.ClientSession() as s:
            await mesh.wait_ready(s)
        mesh_rps = await put_throughput(mesh.urls[0], size, concurrency, duration_s)
    finally:
        mesh.stop()
    return {
        "case": "cost",
        "size": size,
        "concurrency": concurrency,
        "single_puts_per_s": round(single_rps, 1),
        "mesh_puts_per_s": round(mesh_rps, 1),
        "ratio_mesh_to_single": round(mesh_rps / single_rps, 2) if single_rps else None,
    }


def human(size: int) -> str:
    return f"{size // 1024} KiB" if size < 1024 * 1024 else f"{size // (1024 * 1024)} MiB"


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short smoke run")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds per case")
    parser.add_argument("--json-out", type=Path, help="append one JSON line per case here")
    args = parser.parse_args()
    duration = 4.0 if args.quick else args.duration
    cases = [(1024, 50.0, 8), (1024 * 1024, 10.0, 4)]
    results: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="kura-replbench-") as tmp:
        root = Path(tmp)
        for size, rate, _conc in cases:
            results.append(await measure_lag(root / f"lag-{size}", size, rate, duration))
            print(json.dumps(results[-1]), flush=True)
        for size, _rate, conc in cases:
            results.append(await measure_cost(root / f"cost-{size}", size, conc, duration))
            print(json.dumps(results[-1]), flush=True)
    if args.json_out:
        with args.json_out.open("a") as f:
            for r in results:
                f.write(json.dumps(r) + "\n")
    print("\n| artifact | write rate on A | replication lag A→C p50 | p99 | max | errors |")
    print("|---|---|---|---|---|---|")
    for r in results:
        if r["case"] == "lag":
            print(
                f"| {human(int(r['size']))} | {r['rate_per_s']}/s | {r['p50_ms']} ms | "  # type: ignore[call-overload]
                f"{r['p99_ms']} ms | {r['max_ms']} ms | {r['errors']} |"
            )
    print("\n| artifact | writers | single node PUT/s | 3-node mesh PUT/s (on A) | mesh / single |")
    print("|---|---|---|---|---|")
    for r in results:
        if r["case"] == "cost":
            print(
                f"| {human(int(r['size']))} | {r['concurrency']} | {r['single_puts_per_s']} | "  # type: ignore[call-overload]
                f"{r['mesh_puts_per_s']} | {r['ratio_mesh_to_single']} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
