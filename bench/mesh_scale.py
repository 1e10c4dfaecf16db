"""A mesh at scale (issue 11): bootstrap, catch-up and anti-entropy at a million artifacts.

1. **Seed.** Three data dirs (A, B, C) each get the same ``--artifacts`` small artifacts
   (``--size`` bytes, Nx keys ``k0 …``), offline through kura's storage layer (``bench.seed``).
   A, B and C start as a mesh; the time until all three are ready is reported (each has no
   position with its peers yet).
2. **Fresh node.** D starts empty with A, B, C as peers and ``--tmp-budget-mib``. An external
   thread samples D's tmp dir every 5 ms. Reported: time to ``/ready``, artifacts/s and MiB/s,
   D's peak RSS (``VmHWM``), peak tmp against the budget, the metadata requests and bytes D
   spent (``kura_peer_metadata_*{kind="bootstrap"}``), and ``--sample`` random artifacts read
   back from D and compared byte for byte.
3. **Catch-up.** C is stopped. ``--writes`` new artifacts are PUT to A (Nx). After
   ``--down-seconds`` C restarts; reported: time until C holds every new artifact, and C's
   metadata requests and bytes (``kind="changes"``) against D's full walk: the ratio shows the
   cost follows the change, not the dataset.
4. **Anti-entropy.** A, B, C run it every ``--ae-interval`` seconds. Over ``--ae-rounds`` rounds
   between equal nodes, A's ``kura_anti_entropy_*`` counters give the requests, bytes, ranges
   and seconds per round.

    .venv/bin/python bench/mesh_scale.py                       # 1,000,000 artifacts (long)
    .venv/bin/python bench/mesh_scale.py --artifacts 20000 --down-seconds 10   # smoke run

Needs about 5 KiB of disk per artifact per node (4 nodes); ``--root`` picks where (default: a
temporary directory). Prints one JSON line (``--json-out`` appends it) and Markdown tables.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.bootstrap import Watcher, status, wait_ready
from bench.replication import free_port, start_node, stop_node
from bench.seed import body_of, key_of, seed

MiB = 1024 * 1024


def metric_sum(text: str, name: str, **labels: str) -> float:
    """The sum of every sample of ``name`` (``_total`` suffix included) matching ``labels``."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name != name:
                continue
            if all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


async def metrics(s: aiohttp.ClientSession, url: str) -> str:
    async with s.get(url + "/metrics") as r:
        return await r.text()


def peak_rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


class Mesh:
    """The bench's nodes by name: process, public URL and internal URL."""

    def __init__(self, root: Path, env: dict[str, str]) -> None:
        self.root, self.env = root, env
        self.ports = {n: free_port() for n in "ABCD"}
        self.procs: dict[str, subprocess.Popen[str]] = {}
        self.urls: dict[str, str] = {}

    def internal(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"

    def start(self, name: str, peers: str, extra: dict[str, str] | None = None) -> None:
        env = dict(self.env, **(extra or {}))
        peer_urls = [self.internal(p) for p in peers]
        proc, url = start_node(self.root / name, self.ports[name], peer_urls, env)
        self.procs[name], self.urls[name] = proc, url

    def stop(self, name: str) -> None:
        stop_node(self.procs.pop(name), signal.SIGTERM)

    def stop_all(self) -> None:
        for name in list(self.procs):
            self.stop(name)


async def catch_up(
    s: aiohttp.ClientSession, mesh: Mesh, writes: int, down_s: float, size: int, first: int
) -> dict[str, object]:
    mesh.stop("C")
    stopped = time.perf_counter()
    sem = asyncio.Semaphore(8)

    async def put(i: int) -> None:
        async with sem, s.put(f"{mesh.urls['A']}/v1/cache/{key_of(i)}", data=body_of(i, size)) as r:
            assert r.status == 200, await r.text()

    await asyncio.gather(*(put(i) for i in range(first, first + writes)))
    await asyncio.sleep(max(0.0, down_s - (time.perf_counter() - stopped)))
    down = time.perf_counter() - stopped
    mesh.start("C", "ABC", {"KURA_LOG_LEVEL": "INFO"})
    restarted = time.perf_counter()
    missing = set(range(first, first + writes))
    while missing:
        for i in list(missing)[:200]:
            async with s.head(f"{mesh.urls['C']}/v1/cache/{key_of(i)}") as r:
                if r.status == 200:
                    missing.discard(i)
        if time.perf_counter() - restarted > 600:
            break
        await asyncio.sleep(0.05)
    held_s = time.perf_counter() - restarted
    ready_s = await wait_ready(s, mesh.urls["C"], 1800)
    text = await metrics(s, mesh.urls["C"])
    return {
        "down_seconds": round(down, 1),
        "writes": writes,
        "seconds_to_hold_all": round(held_s, 2),
        "seconds_to_ready": round(ready_s, 2),
        "missing_after": len(missing),
        "changes_requests": metric_sum(text, "kura_peer_metadata_requests_total", kind="changes"),
        "changes_bytes": metric_sum(text, "kura_peer_metadata_bytes_total", kind="changes"),
        "bootstrap_requests_on_restart": metric_sum(
            text, "kura_peer_metadata_requests_total", kind="bootstrap"
        ),
        "bootstrap_bytes_on_restart": metric_sum(
            text, "kura_peer_metadata_bytes_total", kind="bootstrap"
        ),
    }


async def anti_entropy(
    s: aiohttp.ClientSession, url: str, rounds: int, timeout_s: float
) -> dict[str, object]:
    names = ("requests", "bytes", "ranges_compared", "ranges_mismatched")

    def read(text: str) -> dict[str, float]:
        got = {n: metric_sum(text, f"kura_anti_entropy_{n}_total") for n in names}
        got["rounds"] = metric_sum(text, "kura_anti_entropy_rounds_total")
        got["repaired"] = metric_sum(text, "kura_anti_entropy_repaired_total")
        got["last_round_seconds"] = metric_sum(text, "kura_anti_entropy_last_round_seconds")
        return got

    start = read(await metrics(s, url))
    deadline = time.perf_counter() + timeout_s
    seconds: list[float] = []
    now = start
    while now["rounds"] < start["rounds"] + rounds and time.perf_counter() < deadline:
        await asyncio.sleep(0.5)
        before = now["rounds"]
        now = read(await metrics(s, url))
        if now["rounds"] > before:
            seconds.append(now["last_round_seconds"])
    done = now["rounds"] - start["rounds"]
    per = {n: round((now[n] - start[n]) / done, 1) if done else None for n in names}
    return {
        "rounds": done,
        **{f"{n}_per_round": v for n, v in per.items()},
        "repaired": now["repaired"] - start["repaired"],
        "round_seconds": seconds,
    }


async def run(args: argparse.Namespace, root: Path) -> dict[str, object]:
    n, size = args.artifacts, args.size
    base_ms = int(time.time() * 1000) - n - 3_600_000
    seeded: dict[str, float] = {}
    for name in "ABC":
        t0 = time.perf_counter()
        seed(root / name / "data", root / name / "tmp", n, size, base_ms)
        seeded[name] = round(time.perf_counter() - t0, 1)
        print(f"seeded {name}: {n} artifacts in {seeded[name]} s", flush=True)
    env = {"KURA_ANTI_ENTROPY_INTERVAL": f"{args.ae_interval}s", "KURA_LOG_LEVEL": "WARNING"}
    mesh = Mesh(root, env)
    result: dict[str, object] = {"artifacts": n, "size": size, "seed_seconds": seeded}
    timeout = aiohttp.ClientTimeout(total=None, sock_read=600)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as s:
            t0 = time.perf_counter()
            for name in "ABC":
                mesh.start(name, "ABC")
            for name in "ABC":
                await wait_ready(s, mesh.urls[name], 3600)
            result["mesh_ready_seconds"] = round(time.perf_counter() - t0, 1)
            print(f"A, B, C ready in {result['mesh_ready_seconds']} s", flush=True)
            # 2. A fresh fourth node.
            budget = args.tmp_budget_mib * MiB
            (root / "D" / "tmp").mkdir(parents=True)
            watcher = Watcher(root / "D" / "tmp")
            watcher.start()
            t0 = time.perf_counter()
            mesh.start("D", "ABC", {"KURA_TMP_DIR_MAX_BYTES": str(budget)})
            boot_s = await wait_ready(s, mesh.urls["D"], 7200)
            boot_s = time.perf_counter() - t0
            watcher.stop_flag.set()
            watcher.join()
            text = await metrics(s, mesh.urls["D"])
            picks = random.Random(7).sample(range(n), min(args.sample, n))
            bad = 0
            for i in picks:
                async with s.get(f"{mesh.urls['D']}/v1/cache/{key_of(i)}") as r:
                    if r.status != 200 or await r.read() != body_of(i, size):
                        bad += 1
            held = await status(s, mesh.urls["D"])
            result["fresh_node"] = {
                "seconds_to_ready": round(boot_s, 1),
                "artifacts_per_s": round(n / boot_s, 1),
                "MiB_per_s": round(n * size / MiB / boot_s, 2),
                "peak_rss_bytes": peak_rss_bytes(mesh.procs["D"].pid),
                "peak_tmp_bytes": watcher.peak,
                "tmp_budget_bytes": budget,
                "tmp_samples": watcher.samples,
                "artifacts_held": held.get("artifacts"),
                "sampled": len(picks),
                "sampled_not_identical": bad,
                "metadata_requests": metric_sum(
                    text, "kura_peer_metadata_requests_total", kind="bootstrap"
                ),
                "metadata_bytes": metric_sum(
                    text, "kura_peer_metadata_bytes_total", kind="bootstrap"
                ),
            }
            print(json.dumps(result["fresh_node"]), flush=True)
            # 3. A node down while writes happen.
            cu = await catch_up(s, mesh, args.writes, args.down_seconds, size, n)
            full = result["fresh_node"]
            assert isinstance(full, dict)
            cu["bytes_ratio_to_full_walk"] = (
                round(float(cu["changes_bytes"]) / full["metadata_bytes"], 5)  # type: ignore[arg-type]
                if full["metadata_bytes"]
                else None
            )
            cu["bytes_per_change"] = round(float(cu["changes_bytes"]) / args.writes, 1)  # type: ignore[arg-type]
            result["catch_up"] = cu
            print(json.dumps(cu), flush=True)
            # 4. Anti-entropy between equal nodes (every node now holds n + writes).
            result["anti_entropy"] = await anti_entropy(
                s, mesh.urls["A"], args.ae_rounds, args.ae_rounds * args.ae_interval * 4 + 120
            )
            print(json.dumps(result["anti_entropy"]), flush=True)
            result["peak_rss_bytes_A"] = peak_rss_bytes(mesh.procs["A"].pid)
    finally:
        mesh.stop_all()
    result["load_avg"] = os.getloadavg()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--artifacts", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=1024, help="bytes per artifact")
    parser.add_argument("--tmp-budget-mib", type=int, default=64)
    parser.add_argument("--writes", type=int, default=1000)
    parser.add_argument("--down-seconds", type=float, default=60.0)
    parser.add_argument("--ae-interval", type=float, default=10.0, help="seconds")
    parser.add_argument("--ae-rounds", type=int, default=3)
    parser.add_argument("--sample", type=int, default=2000, help="artifacts read back from D")
    parser.add_argument("--root", type=Path, help="where the four data dirs go")
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="kura-meshscale-", dir=args.root))
    try:
        result = asyncio.run(run(args, root))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(result))
    if args.json_out:
        with args.json_out.open("a") as f:
            f.write(json.dumps(result) + "\n")
    fresh, cu, ae = result["fresh_node"], result["catch_up"], result["anti_entropy"]
    assert isinstance(fresh, dict)
    assert isinstance(cu, dict)
    assert isinstance(ae, dict)
    print(
        "\n| artifacts | fresh node to /ready | artifacts/s | peak RSS | peak tmp / budget "
        "| metadata requests, bytes | sampled bad |"
    )
    print("|---|---|---|---|---|---|---|")
    print(
        f"| {result['artifacts']:,} × {result['size']} B | {fresh['seconds_to_ready']} s "
        f"| {fresh['artifacts_per_s']} | {fresh['peak_rss_bytes'] / MiB:.0f} MiB "
        f"| {fresh['peak_tmp_bytes'] / MiB:.1f} / {fresh['tmp_budget_bytes'] / MiB:.0f} MiB "
        f"| {fresh['metadata_requests']:.0f}, {fresh['metadata_bytes'] / MiB:.1f} MiB "
        f"| {fresh['sampled_not_identical']} of {fresh['sampled']} |"
    )
    print(
        "\n| down | writes | catch-up requests | catch-up bytes | bytes / full walk | per change |"
    )
    print("|---|---|---|---|---|---|")
    print(
        f"| {cu['down_seconds']} s | {cu['writes']} | {cu['changes_requests']:.0f} "
        f"| {cu['changes_bytes']:.0f} | {cu['bytes_ratio_to_full_walk']} | {cu['bytes_per_change']} |"
    )
    print("\n| anti-entropy rounds | requests/round | bytes/round | ranges/round | seconds |")
    print("|---|---|---|---|---|")
    print(
        f"| {ae['rounds']} | {ae['requests_per_round']} | {ae['bytes_per_round']} "
        f"| {ae['ranges_compared_per_round']} | {ae['round_seconds']} |"
    )
    ok = (
        fresh["sampled_not_identical"] == 0 and fresh["peak_tmp_bytes"] <= fresh["tmp_budget_bytes"]
    )
    return 0 if ok and cu["missing_after"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
