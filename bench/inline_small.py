#!/usr/bin/env python3
"""inline_small: small blobs inline in SQLite against one file per blob, to pick
KURA_INLINE_MAX_BYTES by measurement.

For each body size (default 1, 4, 16, 64 KiB) and each mode -- ``inline``
(KURA_INLINE_MAX_BYTES=1MiB: every tested size is stored in its index row) and ``file``
(KURA_INLINE_MAX_BYTES=0: a staged, fsynced file, renamed, directory fsynced) -- a fresh
``kura serve`` is started on an empty data dir and

  * seeded with --seed blobs (PUT, keep-alive),
  * timed paging through every manifest (/_internal/bootstrap/manifests, what bootstrap,
    reconcile-like scans and the scrub's paging read: the cost of rows that overflow
    SQLite's pages),
  * loaded with a wrk GET run over the seeded keys and a wrk PUT run of fresh keys
    (cachebench; every PUT durable before its answer in both modes).

Repeats are interleaved: repeat r runs every (size, mode) pair, the mode order alternating
per repeat, so a noisy neighbour hits both modes alike. The load average is recorded before
and after every wrk run. One JSON document goes to --out (default
bench/results/inline-<UTC time>.json) with every run and the medians per (op, size, mode).

  nice -n 5 .venv/bin/python bench/inline_small.py --repeat 3 --duration 5
"""

from __future__ import annotations

import argparse
import atexit
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request

from kura_harness.launch.process import free_port

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cachebench as cb
import peers

MODES = {"inline": "1MiB", "file": "0"}


def scan_manifests(internal_url: str) -> tuple[int, float]:
    """(manifests paged, seconds) for one pass over every manifest."""
    after, n = "", 0
    started = time.perf_counter()
    while True:
        url = f"{internal_url}/_internal/bootstrap/manifests?limit=500&after={after}"
        with urllib.request.urlopen(url, timeout=60) as r:
            page = json.load(r)
        n += len(page["manifests"])
        if page["next_after"] is None:
            return n, time.perf_counter() - started
        after = page["next_after"]


def run_one(workdir: str, mode: str, size: int, args: argparse.Namespace) -> list[dict]:
    internal_port = free_port()
    peer = peers.KuraPeer(
        os.path.join(workdir, f"{mode}-{size}-{time.time_ns()}"),
        env={"KURA_INLINE_MAX_BYTES": MODES[mode], "KURA_INTERNAL_PORT": str(internal_port)},
        cleanup="keep",
    )
    peer.start()
    try:
        peer.ready()
        target = peer.target
        blobs = cb.BlobSet(size, f"inline-bench/{size}")
        keys = cb.seed(target, blobs, args.seed)
        scans = [scan_manifests(f"http://127.0.0.1:{internal_port}") for _ in range(3)]
        count, seconds = min(scans, key=lambda s: s[1])
        rows = [
            {
                "op": "SCAN",
                "size": size,
                "mode": mode,
                "manifests": count,
                "ms": round(seconds * 1000, 2),
                "us_per_manifest": round(seconds * 1e6 / max(count, 1), 2),
            }
        ]
        get = cb.run_get(target, keys, size, duration=args.duration, conns=args.conns)
        put = cb.run_put(target, size, duration=args.duration, conns=args.conns)
        for row in (get, put):
            row["mode"] = mode
            rows.append(row)
        blob_files = sum(len(f) for _r, _d, f in os.walk(os.path.join(peer.data_dir, "blobs")))
        db = os.path.join(peer.data_dir, "index.sqlite3")
        for row in rows:
            row["blob_files_after"] = blob_files
            row["index_bytes_after"] = os.path.getsize(db)
        return rows
    finally:
        assert peer.proc is not None
        peer.proc.stop()


def medians(runs: list[dict]) -> list[dict]:
    out = []
    groups: dict[tuple[str, int, str], list[dict]] = {}
    for r in runs:
        groups.setdefault((r["op"], r["size"], r["mode"]), []).append(r)
    for (op, size, mode), rows in sorted(groups.items()):
        m: dict = {"op": op, "size_h": cb.fmt_size(size), "size": size, "mode": mode}
        m["repeats"] = len(rows)
        if op == "SCAN":
            m["us_per_manifest"] = statistics.median(r["us_per_manifest"] for r in rows)
        else:
            m["rps"] = statistics.median(r["rps"] for r in rows)
            m["p50_ms"] = statistics.median(r["p50_ms"] for r in rows)
            m["p99_ms"] = statistics.median(r["p99_ms"] for r in rows)
            m["ok"] = all(r["ok"] for r in rows)
        out.append(m)
    return out


def table(meds: list[dict]) -> str:
    by = {(m["op"], m["size"], m["mode"]): m for m in meds}
    sizes = sorted({m["size"] for m in meds})
    lines = [
        "| case | inline | file | inline / file |",
        "|---|---|---|---|",
    ]
    for op, field in (("PUT", "rps"), ("GET", "rps"), ("SCAN", "us_per_manifest")):
        for size in sizes:
            i, f = by.get((op, size, "inline")), by.get((op, size, "file"))
            if not i or not f:
                continue
            unit = "req/s" if field == "rps" else "µs/manifest"
            ratio = i[field] / f[field] if f[field] else float("nan")
            lines.append(
                f"| {op} {cb.fmt_size(size)} ({unit}) | {i[field]:.1f} | {f[field]:.1f} | "
                f"{ratio:.2f} |"
            )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sizes", default="1K,4K,16K,64K")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--duration", type=float, default=5)
    ap.add_argument("--seed", type=int, default=1000)
    ap.add_argument("--conns", type=int, default=16)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    sizes = [cb.parse_size(s) for s in args.sizes.split(",")]
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%d-%H%M%S")
    out = args.out or os.path.join(peers.HERE, "results", f"inline-{stamp}.json")
    atexit.register(peers.stop_all)
    runs: list[dict] = []
    load_start = cb.loadavg()
    with tempfile.TemporaryDirectory(prefix="inline-bench-") as workdir:
        for r in range(args.repeat):
            order = ["inline", "file"] if r % 2 == 0 else ["file", "inline"]
            for size in sizes:
                for mode in order:
                    cb.log(f"repeat {r + 1}/{args.repeat}: {mode} {cb.fmt_size(size)}")
                    for row in run_one(workdir, mode, size, args):
                        row["repeat"] = r + 1
                        runs.append(row)
    meds = medians(runs)
    doc = {
        "started_utc": stamp,
        "args": vars(args),
        "cpus": os.cpu_count(),
        "load_start": load_start,
        "load_end": cb.loadavg(),
        "medians": meds,
        "runs": runs,
    }
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
    print(table(meds))
    print(f"load average start {load_start}, end {doc['load_end']}; written {out}")


if __name__ == "__main__":
    main()
