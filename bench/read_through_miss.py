"""The latency cost of a miss with read-through on (the default) and off, on loopback.

Starts real ``kura serve`` processes: node A with two peers, B (up) and C (stopped once the mesh
is ready, so A's membership sees it down). For each ``KURA_READ_THROUGH`` mode (``always``,
``never``) it GETs ``--requests`` keys that exist nowhere from A, one after the other, each key
new (so the negative cache never answers), then the same keys again (inside
``KURA_READ_THROUGH_NEGATIVE_TTL_MS``, so with read-through on the negative cache answers).
Reports p50, p99 and max per case as a Markdown table and one JSON line per case.

Usage::

    .venv/bin/python bench/read_through_miss.py               # 500 misses per case
    .venv/bin/python bench/read_through_miss.py --requests 50 # smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench.replication import free_port, percentile, start_node, stop_node
from kit.wait import wait_until_async


def start(root: Path, name: str, port: int, peers: list[str], **extra: str) -> tuple[Any, str]:
    """A node under ``root/name``; ``extra`` are further ``KURA_*`` variables."""
    return start_node(root / name, port, peers, {"KURA_DISCOVERY_INTERVAL_MS": "500", **extra})


def stop(proc: Any) -> None:
    stop_node(proc)


async def until(session: aiohttp.ClientSession, url: str, check: Any, timeout: float) -> None:
    async def holds() -> bool:
        async with session.get(url) as r:
            return bool(check(r.status, await r.read()))

    if await wait_until_async(holds, timeout, interval=0.1):
        return
    raise RuntimeError(f"timed out waiting on {url}")


async def run_case(root: Path, mode: str, requests: int) -> list[dict[str, object]]:
    ports = [free_port() for _ in range(3)]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    procs = []
    try:
        a, a_url = start(root / mode, "a", ports[0], urls, KURA_READ_THROUGH=mode)
        procs.append(a)
        for i in (1, 2):
            proc, _ = start(root / mode, f"n{i}", ports[i], urls)
            procs.append(proc)
        async with aiohttp.ClientSession() as session:
            await until(session, a_url + "/ready", lambda s, _b: s == 200, 60)
            stop(procs[2])  # C goes down

            def c_down(_status: int, body: bytes) -> bool:
                peers = json.loads(body)["peers"]
                return any(p["node_url"] == urls[2] and not p["healthy"] for p in peers)

            await until(session, a_url + "/status", c_down, 30)
            out = []
            keys = [f"/cache/miss/{mode}-{i:05d}" for i in range(requests)]
            for label in ("new key", "repeat inside negative TTL"):
                times = []
                for key in keys:
                    t0 = time.perf_counter()
                    async with session.get(a_url + key) as r:
                        await r.read()
                        assert r.status == 404, r.status
                    times.append((time.perf_counter() - t0) * 1000)
                out.append(
                    {
                        "read_through": mode,
                        "case": label,
                        "requests": len(times),
                        "p50_ms": round(percentile(times, 0.5), 2),
                        "p99_ms": round(percentile(times, 0.99), 2),
                        "max_ms": round(max(times), 2),
                    }
                )
            return out
    finally:
        for proc in procs:
            stop(proc)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=500)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("always", "never"):
            rows += await run_case(Path(tmp), mode, args.requests)
    print("| KURA_READ_THROUGH | case | misses | p50 ms | p99 ms | max ms |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| `{r['read_through']}` | {r['case']} | {r['requests']} | {r['p50_ms']} "
            f"| {r['p99_ms']} | {r['max_ms']} |"
        )
    for r in rows:
        print(json.dumps(r))


if __name__ == "__main__":
    asyncio.run(main())
