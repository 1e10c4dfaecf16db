"""Start-up time against cache size (issue 31, item 2): how long a node takes to answer ``/up``
and ``/ready`` when its data dir already holds N artifacts.

For each ``--counts`` N a data dir is seeded once, offline, with N artifacts of ``--size``
bytes (``bench.seed``: blob files, or rows only with ``--inline``; kept under ``--root`` and
reused by later runs of the same N, size and layout). Then, ``--repeat`` times per N, the page
cache is dropped (``/proc/sys/vm/drop_caches``, as root; a warm start is measured when that is
not allowed, and the output says which) and ``kura serve`` is started on the dir with a public
port chosen beforehand. From the moment the process is spawned, ``/up`` and ``/ready`` are
polled every ``--poll-ms``; the seconds until each first answers 200 are recorded, and the node
is stopped (SIGTERM). Also reported: the data dir's size and the start-up lines the node logged
(reconcile, index check).

    .venv/bin/python -m bench.startup --counts 1000,100000 --repeat 3
    .venv/bin/python -m bench.startup --counts 1000000 --repeat 3 --root /var/tmp/kura-startup

A million artifacts as files need about 4.5 GiB of disk (one 4 KiB block each, plus the index).
Prints one JSON object (``--json-out`` writes it too) and a Markdown table of medians.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from bench.cachebench import loadavg
from bench.peers import machine_info
from bench.seed import seed
from kura_harness.launch.node import kura_env
from kura_harness.launch.process import free_port, stop


def log(*a: object) -> None:
    print(*a, file=sys.stderr, flush=True)


def answers_200(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1.0) as response:
            return int(response.status) == 200
    except (urllib.error.URLError, OSError):
        return False


def drop_page_cache() -> bool:
    """sync, then drop clean pages, dentries and inodes (proc(5)); False when not allowed."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        return False
    return True


def seeded(root: Path, count: int, size: int, inline: bool) -> Path:
    """A node dir (``data``, ``tmp``) holding ``count`` artifacts, seeded once and reused."""
    where = root / f"n{count}-s{size}-{'inline' if inline else 'files'}"
    done = where / "seeded"
    if done.exists():
        return where
    shutil.rmtree(where, ignore_errors=True)
    (where / "tmp").mkdir(parents=True)
    t0 = time.perf_counter()
    written = seed(where / "data", where / "tmp", count, size, 1_700_000_000_000, inline=inline)
    log(f"seeded {count} artifacts ({written} bytes) in {time.perf_counter() - t0:.1f} s")
    done.write_text(str(count))
    return where


def start_once(where: Path, poll_seconds: float, timeout: float) -> dict[str, Any]:
    """Spawn ``kura serve`` on ``where``; seconds until ``/up`` and ``/ready`` answer 200."""
    port = free_port()
    env = kura_env(where / "data", where / "tmp", {"port": port, "log_level": "INFO"})
    base = f"http://127.0.0.1:{port}"
    log_path = where / "kura.log"
    with log_path.open("w") as out:
        t0 = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-m", "kura.cli", "serve"], env=env, stdout=out, stderr=out
        )
    up = ready = None
    try:
        while time.monotonic() - t0 < timeout and ready is None:
            if proc.poll() is not None:
                raise SystemExit(f"kura exited {proc.returncode}: see {log_path}")
            now = time.monotonic() - t0
            if up is None and answers_200(base + "/up"):
                up = now
            if up is not None and answers_200(base + "/ready"):
                ready = time.monotonic() - t0
            time.sleep(poll_seconds)
    finally:
        stop(proc, timeout=60)
    said = [
        line.strip()
        for line in log_path.read_text().splitlines()
        if any(
            w in line
            for w in ("reconcil", "index check", "integrity", "migrat", "listening", "start-up")
        )
    ]
    return {"up_s": up, "ready_s": ready, "log": said[:12]}


def du_bytes(path: Path) -> int:
    out = subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[0])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--counts", default="1000,100000", help="comma-separated artifact counts")
    p.add_argument("--size", type=int, default=512, help="bytes per artifact")
    p.add_argument("--inline", action="store_true", help="bodies in their index rows, no files")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--poll-ms", type=float, default=10)
    p.add_argument("--timeout", type=float, default=1800, help="seconds to wait for /ready")
    p.add_argument("--root", type=Path, help="where seeded dirs are kept (default: a temp dir)")
    p.add_argument("--json-out", type=Path)
    a = p.parse_args()
    root = a.root or Path(tempfile.mkdtemp(prefix="kura-startup-"))
    root.mkdir(parents=True, exist_ok=True)
    run: dict[str, Any] = {"machine": machine_info(), "load_start": loadavg(), "rows": []}
    for count in (int(c) for c in a.counts.split(",")):
        where = seeded(root, count, a.size, a.inline)
        data_bytes = du_bytes(where / "data")
        for repeat in range(a.repeat):
            cold = drop_page_cache()
            row = {
                "artifacts": count,
                "layout": "inline" if a.inline else "files",
                "data_dir_bytes": data_bytes,
                "repeat": repeat,
                "page_cache": "dropped" if cold else "warm",
                "load_before": loadavg(),
                **start_once(where, a.poll_ms / 1000, a.timeout),
            }
            log(json.dumps({k: v for k, v in row.items() if k != "log"}))
            run["rows"].append(row)
    run["load_end"] = loadavg()
    summary = {}
    for count in sorted({r["artifacts"] for r in run["rows"]}):
        mine = [r for r in run["rows"] if r["artifacts"] == count]
        summary[str(count)] = {
            "up_s_median": statistics.median(r["up_s"] for r in mine),
            "ready_s_median": statistics.median(r["ready_s"] for r in mine),
            "up_s": [round(r["up_s"], 3) for r in mine],
            "ready_s": [round(r["ready_s"], 3) for r in mine],
        }
    run["summary"] = summary
    text = json.dumps(run, indent=1)
    print(text)
    if a.json_out:
        a.json_out.write_text(text)
    print("\n| artifacts | /up, s (median) | /ready, s (median) | per repeat (/up; /ready) |")
    print("|---|---|---|---|")
    for count, s in summary.items():
        print(
            f"| {int(count):,} | {s['up_s_median']:.2f} | {s['ready_s_median']:.2f} | "
            f"{s['up_s']}; {s['ready_s']} |"
        )


if __name__ == "__main__":
    main()
