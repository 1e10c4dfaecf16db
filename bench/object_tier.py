"""GET and PUT throughput of kura with the object-storage tier against kura on disk only.

Starts a real SeaweedFS (``weed server -filer -s3`` on loopback, ``kura_harness.launch.seaweedfs``) and
four lone ``kura serve`` processes in the same run (``bench.replication.start_node``, i.e. the
shared launchers in ``kura_harness.launch``):

* ``disk``: disk only, the reference;
* ``tier``: backed by bucket ``kura`` (``KURA_OBJECT_STORE_URL`` and the ``AWS_*`` variables as
  docs/object-storage.md says);
* ``fill``: a second tier node on the same bucket and prefix with an empty disk, not a peer of
  ``tier``: every key ``tier`` wrote is a local miss here that fills from the bucket;
* ``peer``: a disk-only node whose one peer is ``disk`` (anti-entropy off, change feed polled
  hourly, so nothing is copied ahead): every key ``disk`` wrote is a local miss here that is
  read through from ``disk``, the mesh's way to serve a miss without a bucket.

For each repeat, for each size (interleaved; the node measured first alternates by repeat):

1. PUT ``n`` new keys to ``disk`` and to ``tier``. ``tier`` acknowledges under its durability
   rule (on local disk and queued in the durable outbox); the bench then waits until its upload
   queue is empty and every byte is uploaded (``kura_object_store_upload_queue_messages`` = 0 and
   ``kura_object_store_uploaded_bytes_total`` grew by ``n`` x size): ``drain_after_s`` is the time
   from the last acknowledgement to then, ``in_bucket_MBps`` the payload over first PUT to drained.
2. GET hit: the same ``n`` keys from the node that stored them, four times over, each pass in
   another random order (local disk, page-cache hot; four passes so a case lasts long enough).
3. GET miss: ``tier``'s keys from ``fill`` (a fill from the bucket) and ``disk``'s keys from
   ``peer`` (a read-through); how many rows each reader's index grew by is recorded as
   ``stored_locally`` (``n`` when every request was a miss that was stored locally).

Each case is ``n`` requests (a hit case ``4 n``) by ``--concurrency`` aiohttp workers in this
process (the same client for every case); req/s = successful requests / wall time, MB/s =
payload (10^6 bytes) / s; ``cpu_s`` is the CPU seconds each process (``weed`` and the four
nodes) used during the case. The result is one JSON document on stdout (every repeat, medians,
ratios tier/disk-only of the medians and within each repeat, load average before/after each case
and the run, machine, versions); a Markdown table goes to stderr.

Usage::

    .venv/bin/python bench/object_tier.py            # 1K, 64K, 1M; 3 repeats (5 min here)
    .venv/bin/python bench/object_tier.py --quick    # smaller n, 1 repeat (1 min)
    .venv/bin/python bench/object_tier.py --sizes 1K,64K,1M,64M --repeat 3
    .venv/bin/python bench/object_tier.py --table-from saved.json   # the table again
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import os
import platform
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.cachebench import fmt_size, parse_size
from bench.replication import free_port, percentile, ready_200, start_node, stop_node
from kit.wait import wait_until_async
from kura_harness.launch.seaweedfs import SeaweedFS, weed_binary

MB = 1_000_000
# Requests per case and per size (full, --quick), and workers per size.
COUNTS = {1 << 10: (1500, 300), 64 << 10: (800, 150), 1 << 20: (200, 50), 64 << 20: (8, 4)}
CONCURRENCY = {1 << 10: 16, 64 << 10: 16, 1 << 20: 8, 64 << 20: 2}
HIT_PASSES = 4  # a hit case reads its n keys this often (each pass in its own random order)
COMMON = {
    "KURA_MAX_DISK_BYTES": "1TiB",  # no eviction during the run
    "KURA_TMP_DIR_MAX_BYTES": "4GiB",  # concurrent fills of 64 MiB fit the staging budget
    "KURA_ACCESS_LOG": "false",
    "KURA_ANTI_ENTROPY_INTERVAL": "0",
    "KURA_CHANGES_POLL_INTERVAL": "3600",
}
QUEUE = "kura_object_store_upload_queue_messages"
UPLOADED = "kura_object_store_uploaded_bytes_total"


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def index_rows(data_dir: Path) -> int:
    conn = sqlite3.connect(f"file:{data_dir / 'index.sqlite3'}?mode=ro", uri=True)
    try:
        return int(conn.execute("SELECT COUNT(*) FROM artifacts").fetchone()[0])
    finally:
        conn.close()


async def metric(session: aiohttp.ClientSession, url: str, name: str) -> float:
    async with session.get(url + "/metrics") as r:
        text = await r.text()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in (" ", "{"):
            total += float(line.rpartition(" ")[2])
    return total


async def load(
    url: str, method: str, keys: list[str], size: int, concurrency: int, body: bytes = b""
) -> dict[str, Any]:
    """``method`` every key once with ``concurrency`` workers; throughput and latency."""
    todo = iter(keys)
    times: list[float] = []
    errors: list[str] = []
    timeout = aiohttp.ClientTimeout(total=600)
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def worker() -> None:
            for key in todo:
                t0 = time.perf_counter()
                if method == "PUT":
                    payload = body[:-16] + key.encode().rjust(16, b"-")[-16:]
                    async with session.put(f"{url}/cache/{key}", data=payload) as r:
                        await r.read()
                        ok = r.status // 100 == 2
                else:
                    async with session.get(f"{url}/cache/{key}") as r:
                        got = 0
                        async for chunk in r.content.iter_chunked(1 << 20):
                            got += len(chunk)
                        ok = r.status == 200 and got == size
                if ok:
                    times.append(time.perf_counter() - t0)
                elif len(errors) < 5:
                    errors.append(f"{method} {key}: {r.status}")

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
    done = len(times)
    return {
        "requests": len(keys),
        "ok": done,
        "errors": len(keys) - done,
        "error_samples": errors,
        "seconds": round(elapsed, 3),
        "req_s": round(done / elapsed, 1),
        "MBps": round(done * size / elapsed / MB, 2),
        "p50_ms": round(percentile(times, 0.5) * 1000, 2) if times else None,
        "p99_ms": round(percentile(times, 0.99) * 1000, 2) if times else None,
    }


async def drain(url: str, uploaded_before: float, want_bytes: int, timeout: float) -> float:
    """Seconds until ``url``'s upload queue is empty and ``want_bytes`` more were uploaded."""
    t0 = time.perf_counter()
    async with aiohttp.ClientSession() as session:
        while time.perf_counter() - t0 < timeout:
            queued = await metric(session, url, QUEUE)
            uploaded = await metric(session, url, UPLOADED) - uploaded_before
            if queued == 0 and uploaded >= want_bytes:
                return time.perf_counter() - t0
            await asyncio.sleep(0.02)
    raise RuntimeError(f"the upload queue of {url} did not drain in {timeout} s")


class Nodes:
    """SeaweedFS plus the four kura nodes (see the module docstring)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.weed = SeaweedFS(root / "seaweedfs", buckets=("kura",))
        self.procs: list[Any] = []
        self.urls: dict[str, str] = {}
        self.data: dict[str, Path] = {}

    def start(self) -> None:
        self.weed.start()
        tier_env = {**COMMON, **self.weed.env("kura", "bench")}
        disk_port = free_port()
        specs = [
            ("disk", disk_port, [], COMMON),
            ("tier", free_port(), [], tier_env),
            ("fill", free_port(), [], tier_env),
            ("peer", free_port(), [f"http://127.0.0.1:{disk_port}"], COMMON),
        ]
        for name, port, peers, env in specs:
            proc, url = start_node(self.root / name, port, peers, dict(env))
            self.procs.append(proc)
            self.urls[name] = url
            self.data[name] = self.root / name / "data"

    async def wait_ready(self) -> None:
        async with aiohttp.ClientSession() as session:
            for url in self.urls.values():
                if not await wait_until_async(
                    lambda u=url: ready_200(session, u), 120, interval=0.1
                ):
                    raise RuntimeError(f"{url} not ready")

    def cpu(self) -> dict[str, float]:
        assert self.weed.proc is not None
        pids = {
            "weed": self.weed.proc.pid,
            **{n: p.pid for n, p in zip(self.urls, self.procs, strict=True)},
        }
        return {name: cpu_seconds(pid) for name, pid in pids.items()}

    def stop(self) -> None:
        for proc in self.procs:
            stop_node(proc)
        self.weed.stop()


def case_row(case: str, node: str, size: int, repeat: int, result: dict[str, Any]) -> dict:
    return {"case": case, "node": node, "size": fmt_size(size), "repeat": repeat, **result}


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process so far (``/proc/<pid>/stat``, clock ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measured(nodes: Nodes, coro: Any) -> dict[str, Any]:
    """``coro``'s result plus the load average around it and each process's CPU seconds."""
    before, cpu = loadavg(), nodes.cpu()
    result = await coro
    used = {name: round(s - cpu[name], 2) for name, s in nodes.cpu().items()}
    return {**result, "load_before": before, "load_after": loadavg(), "cpu_s": used}


async def one_size(nodes: Nodes, size: int, n: int, conc: int, repeat: int, tag: str) -> list:
    rows: list[dict[str, Any]] = []
    body = os.urandom(size)
    keys = {
        name: [f"{tag}-{name}-{fmt_size(size)}-r{repeat}-{i:06d}" for i in range(n)]
        for name in ("disk", "tier")
    }
    order = ["disk", "tier"] if repeat % 2 == 0 else ["tier", "disk"]
    url = nodes.urls
    for name in order:  # PUT

        async def put(name: str = name) -> dict[str, Any]:
            async with aiohttp.ClientSession() as s:
                uploaded_before = await metric(s, url["tier"], UPLOADED)
            result = await load(url[name], "PUT", keys[name], size, conc, body)
            if name == "tier":  # the CPU figures include the drain
                after = await drain(url["tier"], uploaded_before, n * size, timeout=600)
                result["drain_after_s"] = round(after, 3)
                result["in_bucket_MBps"] = round(n * size / (result["seconds"] + after) / MB, 2)
            return result

        result = await measured(nodes, put())
        rows.append(case_row("put", name, size, repeat, result))
    for name in order:  # GET hit, from the node that stored them, ``HIT_PASSES`` times
        hits = [k for p in range(HIT_PASSES) for k in random.Random(p).sample(keys[name], n)]
        result = await measured(nodes, load(url[name], "GET", hits, size, conc))
        rows.append(case_row("get_hit", name, size, repeat, result))
    # GET miss: fill from the bucket / read-through from the disk-only peer.
    misses = [("fill", "tier"), ("peer", "disk")]
    for reader, writer in misses if repeat % 2 == 0 else misses[::-1]:
        rows_before = index_rows(nodes.data[reader])
        result = await measured(nodes, load(url[reader], "GET", keys[writer], size, conc))
        result["stored_locally"] = index_rows(nodes.data[reader]) - rows_before
        case = "get_miss_fill" if reader == "fill" else "get_miss_read_through"
        rows.append(case_row(case, reader, size, repeat, result))
    return rows


def rate(row: dict[str, Any]) -> float:
    """Successful requests per second, unrounded."""
    return float(row["ok"] / row["seconds"]) if row["seconds"] else 0.0


def summarise(rows: list[dict[str, Any]], sizes: list[int]) -> dict[str, Any]:
    medians: dict[str, dict[str, Any]] = {}
    for size in map(fmt_size, sizes):
        per: dict[str, Any] = {}
        for row in rows:
            if row["size"] != size:
                continue
            per.setdefault(f"{row['case']}/{row['node']}", []).append(row)
        medians[size] = {
            key: {
                "req_s": round(statistics.median(map(rate, group)), 2),
                "MBps": statistics.median(r["MBps"] for r in group),
                "p50_ms": statistics.median(r["p50_ms"] or 0 for r in group),
                "p99_ms": statistics.median(r["p99_ms"] or 0 for r in group),
                "repeats": len(group),
                "errors": sum(r["errors"] for r in group),
                "cpu_s": {
                    proc: statistics.median(r["cpu_s"][proc] for r in group)
                    for proc in group[0].get("cpu_s", {})
                },
                **(
                    {
                        "drain_after_s": statistics.median(r["drain_after_s"] for r in group),
                        "in_bucket_MBps": statistics.median(r["in_bucket_MBps"] for r in group),
                    }
                    if key == "put/tier"
                    else {}
                ),
            }
            for key, group in per.items()
        }
    ratios: dict[str, dict[str, float | None]] = {}
    pairs = {
        "put tier/disk": ("put/tier", "put/disk"),
        "get_hit tier/disk": ("get_hit/tier", "get_hit/disk"),
        "get_miss_fill/disk get_hit": ("get_miss_fill/fill", "get_hit/disk"),
        "get_miss_fill/get_miss_read_through": (
            "get_miss_fill/fill",
            "get_miss_read_through/peer",
        ),
        "get_miss_read_through/disk get_hit": ("get_miss_read_through/peer", "get_hit/disk"),
    }

    def case_of(r: dict[str, Any]) -> tuple[str, str]:
        return r["size"], f"{r['case']}/{r['node']}"

    exact = {  # unrounded medians of req/s
        key: statistics.median(rate(r) for r in rows if case_of(r) == key)
        for key in {case_of(r) for r in rows}
    }
    # The same ratios within each repeat (the two cases ran minutes apart at most).
    by = {(r["size"], r["repeat"], f"{r['case']}/{r['node']}"): rate(r) for r in rows}
    repeats = sorted({r["repeat"] for r in rows})
    per_repeat: dict[str, dict[str, list[float]]] = {}
    for size in medians:
        ratios[size] = {
            label: round(exact[(size, a)] / exact[(size, b)], 3) if exact[(size, b)] else None
            for label, (a, b) in pairs.items()
        }
        per_repeat[size] = {
            label: [
                round(by[(size, k, a)] / by[(size, k, b)], 3)
                for k in repeats
                if by.get((size, k, b)) and (size, k, a) in by
            ]
            for label, (a, b) in pairs.items()
        }
    return {"medians": medians, "ratios": ratios, "ratios_per_repeat": per_repeat}


def versions() -> dict[str, str]:
    here = Path(__file__).resolve().parent.parent
    rev = subprocess.run(
        ["git", "-C", str(here), "describe", "--always", "--dirty"], capture_output=True, text=True
    ).stdout.strip()
    weed = subprocess.run([weed_binary(), "version"], capture_output=True, text=True).stdout
    return {
        "kura": importlib.metadata.version("kura"),
        "kura_git": rev,
        "weed": weed.splitlines()[0].strip() if weed else "?",
        "obstore": importlib.metadata.version("obstore"),
        "aiohttp": importlib.metadata.version("aiohttp"),
        "python": platform.python_version(),
    }


def machine() -> dict[str, Any]:
    mem = Path("/proc/meminfo").read_text().splitlines()[0].split()[1]
    return {
        "cpus": os.cpu_count(),
        "mem_gib": round(int(mem) / (1 << 20), 1),
        "kernel": platform.release(),
    }


def table(summary: dict[str, Any]) -> str:
    lines = [
        "| size | case | disk-only: req/s (MB/s) | with the tier: req/s (MB/s) | tier / disk-only |",
        "|---|---|---|---|---|",
    ]

    def cell(m: dict[str, Any]) -> str:
        return f"{m['req_s']} ({m['MBps']})"

    for size, med in summary["medians"].items():
        each = summary["ratios_per_repeat"][size]
        rat = {
            k: f"**{v}** ({', '.join(map(str, each[k]))})"
            for k, v in summary["ratios"][size].items()
        }
        put = med["put/tier"]
        lines += [
            f"| {size} | PUT | {cell(med['put/disk'])} | {cell(put)} | {rat['put tier/disk']} |",
            f"| {size} | upload queue drained | | {put['drain_after_s']} s after the last ack, "
            f"{put['in_bucket_MBps']} MB/s into the bucket | |",
            f"| {size} | GET hit (local) | {cell(med['get_hit/disk'])} "
            f"| {cell(med['get_hit/tier'])} | {rat['get_hit tier/disk']} |",
            f"| {size} | GET miss: read-through from a peer / fill from the bucket "
            f"| {cell(med['get_miss_read_through/peer'])} | {cell(med['get_miss_fill/fill'])} "
            f"| {rat['get_miss_fill/get_miss_read_through']} |",
            f"| {size} | GET miss (fill) / disk-only GET hit | | | "
            f"{rat['get_miss_fill/disk get_hit']} |",
        ]
    return "\n".join(lines)


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller n per case, 1 repeat")
    parser.add_argument("--sizes", default="1K,64K,1M", help="comma-separated (1K, 64K, 1M, 64M)")
    parser.add_argument("--repeat", type=int, help="repeats per case (default 3, --quick 1)")
    parser.add_argument("--requests", type=int, help="requests per case (default: per size)")
    parser.add_argument("--concurrency", type=int, help="workers per case (default: per size)")
    parser.add_argument("--workdir", type=Path, help="keep everything here (default: a temp dir)")
    parser.add_argument("--table-from", type=Path, help="print the table of a saved JSON document")
    args = parser.parse_args()
    if args.table_from:
        saved = json.loads(args.table_from.read_text())
        print(table(summarise(saved["rows"], [parse_size(s) for s in saved["medians"]])))
        return 0
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    repeat = args.repeat or (1 if args.quick else 3)
    run_load = {"before": loadavg()}
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="kura-tierbench-") as tmp:
        root = args.workdir or Path(tmp)
        nodes = Nodes(root)
        try:
            nodes.start()
            await nodes.wait_ready()
            for r in range(repeat):
                for size in sizes:
                    n = args.requests or COUNTS.get(size, (100, 20))[1 if args.quick else 0]
                    conc = args.concurrency or CONCURRENCY.get(size, 8)
                    new = await one_size(nodes, size, n, conc, r, f"{int(time.time())}")
                    for row in new:
                        print(json.dumps(row), file=sys.stderr, flush=True)
                    rows += new
        finally:
            nodes.stop()
    run_load["after"] = loadavg()
    summary = summarise(rows, sizes)
    doc = {
        "bench": "object_tier",
        "command": " ".join(["bench/object_tier.py", *sys.argv[1:]]),
        "seconds": round(time.perf_counter() - started, 1),
        "machine": machine(),
        "versions": versions(),
        "load_average": run_load,
        "settings": {
            "common": COMMON,
            "tier": "KURA_OBJECT_STORE_URL=s3://kura/bench on one local weed server",
            "concurrency": {fmt_size(s): args.concurrency or CONCURRENCY.get(s, 8) for s in sizes},
            "repeats": repeat,
            "hit_passes": HIT_PASSES,
            "requests": {
                fmt_size(s): args.requests or COUNTS.get(s, (100, 20))[1 if args.quick else 0]
                for s in sizes
            },
        },
        **summary,
        "rows": rows,
    }
    print(table(summary), file=sys.stderr)
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
