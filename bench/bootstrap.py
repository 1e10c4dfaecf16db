"""Bootstrap at scale: a fresh node joins a 3-node mesh holding ~2 GB, within a 256 MiB tmp budget.

1. Start A, B, C (a mesh) and write artifacts of 1 KiB to 200 MiB through the plain HTTP cache
   API, spread over the three nodes; wait until every outbox is drained (each node holds all).
2. Baseline: copy the same bytes from one peer with a plain HTTP client (aiohttp, 4 concurrent
   GETs of ``/_internal/bootstrap/artifacts/{id}``, each streamed to a file).
3. Start D, empty, with ``KURA_TMP_DIR_MAX_BYTES`` = 256 MiB and A, B, C as peers. An external
   thread samples D's tmp dir every 5 ms. Time until D's ``/ready`` is 200.
4. Check every artifact on D is byte-identical (SHA-256 of a full GET), and the tmp peak.

Prints one JSON line and a Markdown table: bootstrap throughput, baseline throughput, ratio,
peak tmp vs budget.

    .venv/bin/python bench/bootstrap.py              # ~2 GB (a few minutes)
    .venv/bin/python bench/bootstrap.py --quick      # ~200 MB smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.replication import Cluster, free_port, ready_200
from kit.wait import wait_until_async
from kura_harness.launch.node import spawn_kura
from kura_harness.rolling.sampler import dir_bytes

KiB = 1024
MiB = 1024 * KiB

FULL_PLAN = [  # (count, size)
    (1000, 1 * KiB),
    (200, 64 * KiB),
    (100, 1 * MiB),
    (20, 16 * MiB),
    (5, 100 * MiB),
    (5, 200 * MiB),
]
QUICK_PLAN = [(200, 1 * KiB), (50, 64 * KiB), (20, 1 * MiB), (5, 16 * MiB), (1, 100 * MiB)]


def body_chunks(seed: int, size: int, chunk: int = 1 * MiB):  # type: ignore[no-untyped-def]
    rng = random.Random(seed)
    left = size
    while left:
        n = min(chunk, left)
        yield rng.randbytes(n)
        left -= n


def digest_of(seed: int, size: int) -> str:
    h = hashlib.sha256()
    for c in body_chunks(seed, size):
        h.update(c)
    return h.hexdigest()


class Watcher(threading.Thread):
    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path, self.peak, self.samples, self.stop_flag = path, 0, 0, threading.Event()

    def run(self) -> None:
        while not self.stop_flag.is_set():
            self.peak = max(self.peak, dir_bytes(self.path))
            self.samples += 1
            time.sleep(0.005)


async def wait_ready(session: aiohttp.ClientSession, url: str, timeout: float) -> float:
    """Seconds until ``url`` answers 200 on /ready; RuntimeError after ``timeout`` seconds."""
    start = time.perf_counter()
    if await wait_until_async(lambda: ready_200(session, url), timeout):
        return time.perf_counter() - start
    raise RuntimeError(f"{url} not ready after {timeout}s")


async def status(session: aiohttp.ClientSession, url: str) -> dict[str, object]:
    async with session.get(url + "/status") as r:
        return await r.json()  # type: ignore[no-any-return]


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--budget-mib", type=int, default=256)
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    plan = QUICK_PLAN if args.quick else FULL_PLAN
    artifacts = []
    seed = 0
    for count, size in plan:
        for _ in range(count):
            seed += 1
            artifacts.append((f"boot/{seed:05d}", seed, size))
    total = sum(size for _k, _s, size in artifacts)
    budget = args.budget_mib * MiB
    print(
        f"plan: {len(artifacts)} artifacts, {total / MiB:.0f} MiB; joiner tmp budget "
        f"{args.budget_mib} MiB",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="kura-bootbench-") as tmp:
        root = Path(tmp)
        mesh = Cluster(root / "mesh", 3)
        joiner = None
        try:
            timeout = aiohttp.ClientTimeout(total=None, sock_read=300)
            async with aiohttp.ClientSession(timeout=timeout) as s:
                await mesh.wait_ready(s)
                t0 = time.perf_counter()
                sem = asyncio.Semaphore(4)

                async def put(i: int, key: str, sd: int, size: int) -> None:
                    async with sem:
                        url = mesh.urls[i % 3]

                        async def gen():  # type: ignore[no-untyped-def]
                            for c in body_chunks(sd, size):
                                yield c

                        async with s.put(
                            f"{url}/cache/{key}", data=gen(), headers={"Content-Length": str(size)}
                        ) as r:
                            assert r.status // 100 == 2, await r.text()

                await asyncio.gather(
                    *(put(i, k, sd, sz) for i, (k, sd, sz) in enumerate(artifacts))
                )
                for url in mesh.urls:
                    while (await status(s, url))["outbox_messages"] != 0:
                        await asyncio.sleep(0.2)
                fill_s = time.perf_counter() - t0
                print(f"filled the 3-node mesh in {fill_s:.1f}s", flush=True)
                # Baseline: a plain HTTP client copies the same bytes from one peer.
                st = await status(s, mesh.urls[0])
                internal_a = str(st["node_url"])
                ids = []
                after = ""
                while True:
                    async with s.get(
                        f"{internal_a}/_internal/bootstrap/manifests",
                        params={"after": after, "limit": "1000"},
                    ) as r:
                        page = await r.json()
                    ids += [m["artifact_id"] for m in page["manifests"]]
                    if page["next_after"] is None:
                        break
                    after = page["next_after"]
                copy_dir = root / "plain-copy"
                copy_dir.mkdir()
                t0 = time.perf_counter()

                async def copy(aid: str) -> None:
                    async with sem:
                        async with s.get(f"{internal_a}/_internal/bootstrap/artifacts/{aid}") as r:
                            with (copy_dir / aid).open("wb") as f:
                                async for c in r.content.iter_chunked(1 * MiB):
                                    f.write(c)

                await asyncio.gather(*(copy(a) for a in ids))
                plain_s = time.perf_counter() - t0
                for p in copy_dir.iterdir():
                    p.unlink()
                # The joiner.
                d_port = free_port()
                peer_urls = [str((await status(s, u))["node_url"]) for u in mesh.urls]
                # Not the bench's own KURA_BENCH_* knobs: kura serve refuses an unknown
                # KURA_* variable (kura.settings.load_settings).
                env = {k: v for k, v in os.environ.items() if not k.startswith("KURA_BENCH_")}
                env.update(
                    {
                        "KURA_PORT": "0",
                        "KURA_INTERNAL_PORT": str(d_port),
                        "KURA_NODE_URL": f"http://127.0.0.1:{d_port}",
                        "KURA_PEERS": ",".join(peer_urls),
                        "KURA_DATA_DIR": str(root / "d/data"),
                        "KURA_TMP_DIR": str(root / "d/tmp"),
                        "KURA_TMP_DIR_MAX_BYTES": str(budget),
                        "KURA_MIN_FREE_DISK_BYTES": "0",
                        "KURA_DISCOVERY_SETTLE_MS": "0",
                        "KURA_LOG_LEVEL": os.environ.get("KURA_BENCH_JOINER_LOG_LEVEL", "WARNING"),
                    }
                )
                (root / "d/tmp").mkdir(parents=True)
                watcher = Watcher(root / "d/tmp")
                watcher.start()
                t0 = time.perf_counter()
                joiner = spawn_kura(
                    env, root / "joiner.log", start_new_session=True, timeout=1800, log_mode="w"
                )
                d_url = joiner.url
                await wait_ready(s, d_url, 1800)
                boot_s = time.perf_counter() - t0
                watcher.stop_flag.set()
                watcher.join()
                if os.environ.get("KURA_BENCH_SHOW_LOG"):
                    print((root / "joiner.log").read_text()[-6000:])
                # Verify every byte on D.
                bad = 0
                for key, sd, size in artifacts:
                    h = hashlib.sha256()
                    async with s.get(f"{d_url}/cache/{key}") as r:
                        if r.status != 200:
                            bad += 1
                            continue
                        async for c in r.content.iter_chunked(1 * MiB):
                            h.update(c)
                    if h.hexdigest() != digest_of(sd, size):
                        bad += 1
        finally:
            if joiner is not None:
                joiner.stop(timeout=60)
            mesh.stop()
    result = {
        "artifacts": len(artifacts),
        "total_bytes": total,
        "budget_bytes": budget,
        "bootstrap_seconds": round(boot_s, 2),
        "plain_copy_seconds": round(plain_s, 2),
        "bootstrap_MiBps": round(total / MiB / boot_s, 1),
        "plain_copy_MiBps": round(total / MiB / plain_s, 1),
        "ratio_bootstrap_to_plain": round(plain_s / boot_s, 2),
        "peak_tmp_bytes": watcher.peak,
        "tmp_samples": watcher.samples,
        "mismatched_or_missing": bad,
        "load_avg": os.getloadavg(),
    }
    print(json.dumps(result))
    if args.json_out:
        with args.json_out.open("a") as f:
            f.write(json.dumps(result) + "\n")
    print(
        f"\n| data | tmp budget | bootstrap to /ready | plain HTTP copy | ratio | peak tmp | bad |"
        f"\n|---|---|---|---|---|---|---|\n| {len(artifacts)} artifacts, {total / MiB:.0f} MiB "
        f"| {budget // MiB} MiB | {boot_s:.1f} s ({result['bootstrap_MiBps']} MiB/s) "
        f"| {plain_s:.1f} s ({result['plain_copy_MiBps']} MiB/s) "
        f"| {result['ratio_bootstrap_to_plain']} | {watcher.peak / MiB:.1f} MiB | {bad} |"
    )
    return 0 if bad == 0 and watcher.peak <= budget else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
