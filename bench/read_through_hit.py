"""The latency of a read-through hit against a local hit, and what read-throughs cost the
other requests of the node, on loopback.

Starts real ``kura serve`` processes. Node A stores ``2 * --count`` artifacts of each size,
alone. Then A restarts with B as its peer, and B starts empty with
``KURA_BOOTSTRAP_DISK_PERCENT=1``: its bootstrap stops after 1 % of its disk budget, so nearly
every artifact is still on A only. For each size:

* **latency**: ``--count`` artifacts are read one after the other over one keep-alive
  connection, 50 ms apart (so each read-through's background store is done before the next
  read): from A (a local hit), from B for the first time (a read-through: B fetches the copy
  from A, verifies it and serves it, then stores it; a key B already held is not counted, by
  B's ``kura_read_through_total{result="hit"}``), and from B again (a local hit there);
* **bystanders**: a client reads a 1 KiB artifact that B holds, every 5 ms, first while B is
  otherwise idle, then while the other ``--count`` artifacts are read through B back to back.
  Their latencies show how much the read-throughs (fetch, verify, background store) hold up
  the node's other requests.

Reports p50, p90 (bystanders: p99) and max per case as a Markdown table, and one JSON line
per case.

Usage::

    .venv/bin/python -m bench.read_through_hit                     # 40 each of 256 KiB, 1 and 4 MiB
    .venv/bin/python -m bench.read_through_hit --count 10 --workers 1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench.replication import free_port, percentile, ready_200, start_node, stop_node
from kit.wait import wait_until_async

KiB = 1024
MiB = 1024 * KiB
HITS = re.compile(r'^kura_read_through_total\{result="hit"\} (\S+)$', re.M)


async def wait_ready(session: aiohttp.ClientSession, url: str, timeout: float = 60) -> None:
    if await wait_until_async(
        lambda: ready_200(session, url), timeout, interval=0.1, ignoring=(aiohttp.ClientError,)
    ):
        return
    raise RuntimeError(f"{url} not ready after {timeout} s")


async def timed_get(session: aiohttp.ClientSession, url: str) -> float:
    started = time.perf_counter()
    async with session.get(url) as r:
        await r.read()
        if r.status != 200:
            raise RuntimeError(f"GET {url}: {r.status}")
    return (time.perf_counter() - started) * 1000


async def read_through_hits(session: aiohttp.ClientSession, url: str) -> float:
    async with session.get(url + "/metrics") as r:
        m = HITS.search(await r.text())
    return float(m.group(1)) if m else 0.0


def row(case: str, size: int, times: list[float]) -> dict[str, Any]:
    return {
        "case": case,
        "size_bytes": size,
        "reads": len(times),
        "p50_ms": round(percentile(times, 0.5), 2),
        "p90_ms": round(percentile(times, 0.9), 2),
        "max_ms": round(max(times), 2),
    }


async def latency(
    session: aiohttp.ClientSession, a_url: str, b_url: str, size: int, paths: list[str]
) -> list[dict[str, Any]]:
    local_a, through, local_b = [], [], []
    for path in paths:
        local_a.append(await timed_get(session, a_url + path))
    for path in paths:
        before = await read_through_hits(session, b_url)
        took = await timed_get(session, b_url + path)
        if await read_through_hits(session, b_url) > before:
            through.append(took)
        await asyncio.sleep(0.05)  # its background store finishes
    for path in paths:
        local_b.append(await timed_get(session, b_url + path))
    rows = [row("local hit on A", size, local_a)]
    if through:
        rows.append(row("read-through hit on B", size, through))
    return [*rows, row("local hit on B after", size, local_b)]


async def bystanders(
    session: aiohttp.ClientSession, b_url: str, small: str, size: int, paths: list[str]
) -> list[dict[str, Any]]:
    async def read_small(times: list[float], stop: asyncio.Event) -> None:
        async with aiohttp.ClientSession() as own:  # its own connection
            while not stop.is_set():
                times.append(await timed_get(own, b_url + small))
                await asyncio.sleep(0.005)

    out = []
    for case in ("bystander 1 KiB reads on B, idle", "bystander 1 KiB reads on B, during"):
        times: list[float] = []
        stop = asyncio.Event()
        task = asyncio.create_task(read_small(times, stop))
        started = time.monotonic()
        if case.endswith("during"):
            for path in paths:
                await timed_get(session, b_url + path)
            elapsed = time.monotonic() - started
        else:
            elapsed = 2.0
            await asyncio.sleep(elapsed)
        stop.set()
        await task
        r = row(case, size, times)
        r["p90_ms"] = round(percentile(times, 0.99), 2)  # reported as p99 for bystanders
        r["seconds"] = round(elapsed, 2)
        out.append(r)
    return out


async def run(root: Path, sizes: list[int], count: int, workers: str) -> list[dict[str, Any]]:
    pa, pb = free_port(), free_port()
    ia, ib = f"http://127.0.0.1:{pa}", f"http://127.0.0.1:{pb}"
    common = {"KURA_WORKERS": workers}
    a, a_url = start_node(root / "a", pa, [ia], common)
    procs = [a]
    try:
        async with aiohttp.ClientSession() as session:
            await wait_ready(session, a_url)
            keys = {size: [f"/cache/rt/{size}/{i:04d}" for i in range(2 * count)] for size in sizes}
            for size, paths in keys.items():
                for path in paths:
                    async with session.put(a_url + path, data=os.urandom(size)) as r:
                        assert r.status == 201, r.status
            stop_node(a)
            a, a_url = start_node(root / "a", pa, [ia, ib], common)
            procs[0] = a
            b, b_url = start_node(
                root / "b",
                pb,
                [ia, ib],
                {
                    **common,
                    "KURA_MAX_DISK_BYTES": str(2048 * MiB),
                    "KURA_BOOTSTRAP_DISK_PERCENT": "1",
                },
            )
            procs.append(b)
            await wait_ready(session, a_url)
            await wait_ready(session, b_url)
            small = "/cache/rt/bystander"
            async with session.put(b_url + small, data=os.urandom(KiB)) as r:
                assert r.status == 201, r.status
            rows = []
            for size, paths in keys.items():
                rows += await latency(session, a_url, b_url, size, paths[:count])
                rows += await bystanders(session, b_url, small, size, paths[count:])
            return rows
    finally:
        for proc in procs:
            stop_node(proc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=40, help="artifacts of each size")
    parser.add_argument("--sizes", default="256K,1M,4M", help="comma-separated, K or M suffix")
    parser.add_argument("--workers", default="auto", help="KURA_WORKERS of both nodes")
    args = parser.parse_args()
    units = {"K": KiB, "M": MiB}
    sizes = [
        int(s[:-1]) * units[s[-1]] if s[-1] in units else int(s) for s in args.sizes.split(",")
    ]
    with tempfile.TemporaryDirectory() as tmp:
        rows = asyncio.run(run(Path(tmp), sizes, args.count, args.workers))
    load = os.getloadavg()[0]
    print(f"KURA_WORKERS={args.workers}, 1-minute load average {load:.2f} at the end")
    print("| size | case | reads | p50 ms | p90 ms (bystanders: p99) | max ms |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['size_bytes'] // KiB} KiB | {r['case']} | {r['reads']} | {r['p50_ms']} "
            f"| {r['p90_ms']} | {r['max_ms']} |"
        )
    for r in rows:
        print(json.dumps({**r, "workers": args.workers, "load_1m": round(load, 2)}))


if __name__ == "__main__":
    main()
