#!/usr/bin/env python3
"""Profile kura under a wrk GET (or --method PUT) load with py-spy: flame graph, collapsed
stacks, top functions.

    .venv/bin/pip install py-spy        # once
    .venv/bin/python bench/profile_kura.py --size 1K --out /tmp/kura-get-1k
    .venv/bin/python bench/profile_kura.py --size 1M --kura-rev HEAD --out /tmp/kura-get-1m

Starts one kura (same settings as peers.py) in a temp dir, seeds the GET set of that size,
runs wrk (2 threads, peers.py's connection count) for --duration seconds and samples the
process with `py-spy record` twice inside that window. Writes OUT.txt (collapsed stacks, one
thread per root frame) and OUT.svg (flame graph of the second window) and prints the wrk result
plus, per thread group, the self samples per package and the functions with the most self and
inclusive samples (--analyse OUT.txt, or a gzipped OUT.txt.gz, prints them again). --wrk-only skips py-spy
(throughput without the sampler's overhead). py-spy runs with --nonblocking, so the process
is not paused while sampled.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cachebench as cb
import peers


def py_spy() -> str:
    for cand in (os.path.join(peers.REPO, ".venv", "bin", "py-spy"), shutil.which("py-spy")):
        if cand and os.path.exists(cand):
            return cand
    raise SystemExit("py-spy not found: .venv/bin/pip install py-spy")


# Cost buckets for the breakdown: the first rule matching a frame, from the leaf upwards, wins.
# (C functions such as f.read or sha256 are charged to the Python frame that called them.)
CATEGORIES = (
    ("prometheus metrics", r"prometheus_client/"),
    ("fsync (staged file, blob directory)", r"fsync"),
    (
        "SQLite write (writer thread: _commit_sync)",
        r"_commit_sync|MetadataIndex\.(upsert|tombstone|touch)|digests\.py|change_seq|sqlite",
    ),
    ("hashing (sha256, xxh3)", r"BodyDigests|hashlib|xxh"),
    ("tmp dir walk", r"untracked_bytes_on_disk|tmp_dir_bytes|tmp_occupancy|walk"),
    (
        "executor hop (submit, wake-up, future chaining)",
        r"ThreadPoolExecutor\.submit|run_in_executor|wrap_future|_chain_future|_call_set_state|"
        r"_read_from_self|_write_to_self|call_soon_threadsafe|Future\.set_result|"
        r"_invoke_callbacks|Future\.set_running|concurrent/futures/thread\.py|Condition\.|"
        r"Semaphore\.|_WorkItem",
    ),
    ("SQLite lookup (index.get, row to Manifest)", r"MetadataIndex\.|_row_to_manifest|json/"),
    ("open() + pathlib", r"Path\.open|pathlib\.py|BlobFiles\.blob_path"),
    ("rest of _read_sync (fstat, read, sha256)", r"ArtifactReads\._read_sync"),
    ("sendfile", r"sendfile"),
    (
        "aiohttp response (headers, write)",
        r"_write_headers|write_eof|StreamWriter|_SelectorSocketTransport\.write|Response\.|"
        r"StreamResponse|http_writer",
    ),
    (
        "aiohttp request (parse, route, dispatch)",
        r"data_received|HttpRequestParser|UrlDispatcher|Resource\.resolve|_match|web_request|"
        r"BaseRequest|RequestHandler\.start|_handle_request|Application\._handle|"
        r"web_urldispatcher",
    ),
    ("middleware (_track_handler)", r"_fix_request_current_app|_track_handler"),
    (
        "kura handler code (endpoint wrapper, keys, serve)",
        r"kura/api/|(CacheService|ArtifactReads)\.read|ArtifactReads\._in|kura/core/",
    ),
    ("socket recv", r"_read_ready"),
    (
        "event loop (select, _run_once, Handle._run)",
        r"selectors\.py|_run_once|Handle\._run|base_events|events\.py",
    ),
)


def _category(funcs: list[str]) -> str:
    for fn in reversed(funcs):
        for name, pattern in CATEGORIES:
            if re.search(pattern, fn):
                return name
    return "other"


def _thread_group(root: str) -> str:
    """'thread (123): kura-read_2' -> 'kura-read' (one group per pool; MainThread = event loop)."""
    name = root.split(":", 1)[1].strip() if ":" in root else root
    name = re.sub(r"_\d+$", "", name)
    return "MainThread (event loop)" if name == "MainThread" else name


def _package(frame: str) -> str:
    """'Handle._run (asyncio/events.py)' -> 'asyncio': the leaf file's top directory."""
    m = re.search(r"\(([^)]*?)(:\d+)?\)$", frame)
    return (m.group(1) if m else frame).split("/")[0]


def top_functions(collapsed: str, n: int) -> str:
    """Self and inclusive sample shares per function, and self shares per package, per thread
    group (py-spy --threads). COLLAPSED may be gzipped (.gz)."""
    self_c: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    pkg_c: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    incl_c: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    totals: collections.Counter = collections.Counter()
    buckets: collections.Counter = collections.Counter()
    with (gzip.open if collapsed.endswith(".gz") else open)(collapsed, "rt") as f:
        for line in f:
            stack, _, count_s = line.rstrip("\n").rpartition(" ")
            if not stack:
                continue
            count = int(count_s)
            frames = stack.split(";")
            role = ""
            while frames[0].startswith("process "):  # nested: a child under its parent
                # --subprocesses: a worker's threads are grouped apart from the primary's
                role = "worker " if "kura.workers.worker" in frames[0] else "primary "
                frames = frames[1:]
            group = _thread_group(frames[0]) if frames[0].startswith("thread (") else "?"
            group = role + group
            funcs = [re.sub(r":\d+\)$", ")", fr) for fr in frames[1:]] or ["<no Python frame>"]
            totals[group] += count
            totals["all"] += count
            buckets[(group, _category(funcs))] += count
            self_c[group][funcs[-1]] += count
            pkg_c[group][_package(funcs[-1])] += count
            for fn in set(funcs):
                incl_c[group][fn] += count
    out = [f"samples: {totals['all']} (rate x seconds x threads with a Python stack)"]
    out.append("\n== cost breakdown (share of all samples)")
    for (group, name), c in buckets.most_common():
        out.append(f"{c / totals['all']:6.1%}  {group:32s} {name}")
    for group in sorted(self_c, key=lambda g: -totals[g]):
        out.append(f"\n== {group}: {totals[group]} samples ({totals[group] / totals['all']:.0%})")
        out.append("-- self, per package (the leaf frame's top directory)")
        for pkg, c in pkg_c[group].most_common(n):
            out.append(f"{c / totals[group]:6.1%}  {pkg}")
        out.append("-- self")
        for fn, c in self_c[group].most_common(n):
            out.append(f"{c / totals[group]:6.1%}  {fn}")
        out.append("-- inclusive")
        for fn, c in incl_c[group].most_common(n):
            out.append(f"{c / totals[group]:6.1%}  {fn}")
    return "\n".join(out)


def _machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of all CPUs from /proc/stat."""
    with open("/proc/stat") as f:
        vals = [int(x) for x in f.readline().split()[1:]]
    idle = vals[3] + vals[4]
    return sum(vals) - idle, sum(vals)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--size", default="1K")
    ap.add_argument("--method", choices=["GET", "PUT"], default="GET", help="the wrk load")
    ap.add_argument("--duration", type=float, default=50, help="wrk seconds")
    ap.add_argument(
        "--sample", type=float, default=20, help="seconds of each of the two py-spy recordings"
    )
    ap.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    ap.add_argument("--conns", type=int)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kura-rev", metavar="REV")
    ap.add_argument("--kura-cmd")
    ap.add_argument("--kura-env", action="append", default=[], metavar="KURA_X=VALUE")
    ap.add_argument("--out", default="/tmp/kura-profile", help="output path prefix")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument(
        "--analyse", metavar="TXT", help="only print the top functions of a .txt (or .txt.gz)"
    )
    ap.add_argument("--wrk-only", action="store_true", help="no py-spy: plain throughput")
    ap.add_argument(
        "--subprocesses",
        action="store_true",
        help="py-spy --subprocesses: sample the workers too (KURA_WORKERS > 1); each thread "
        "group is prefixed 'primary' or 'worker'",
    )
    ap.add_argument(
        "--gil",
        action="store_true",
        help="py-spy --gil: only samples of the thread holding the GIL",
    )
    a = ap.parse_args()
    if a.analyse:
        print(top_functions(a.analyse, a.top))
        return

    size = cb.parse_size(a.size)
    workdir = tempfile.mkdtemp(prefix="kura-profile-")
    peer = peers.KuraPeer(
        workdir,
        cmd=a.kura_cmd.split() if a.kura_cmd else None,
        env=peers._env_pairs(a.kura_env),
        rev=a.kura_rev,
    )
    try:
        peer.start()
        peer.ready()
        assert peer.proc is not None
        pid = peer.proc.pid
        cb.log(f"kura pid {pid} on port {peer.port}: {peer.describe()}")
        keys = cb.seed(peer.target, cb.BlobSet(size, "seed"), cb.default_seed_count(size))
        subprocess.run(["sync"])
        result: dict = {}

        def load() -> None:
            if a.method == "PUT":
                result.update(
                    cb.run_put(
                        peer.target, size, threads=a.threads, conns=a.conns, duration=a.duration
                    )
                )
                return
            result.update(
                cb.run_get(
                    peer.target,
                    keys,
                    size,
                    threads=a.threads,
                    conns=a.conns,
                    duration=a.duration,
                )
            )

        t = threading.Thread(target=load)
        cpu0, busy0, wall0 = cb.tree_cpu_seconds(pid), _machine_busy(), time.monotonic()
        t.start()
        if not a.wrk_only:
            # wrk runs for --duration; sample twice inside it (collapsed stacks, then the SVG)
            time.sleep(max(0.0, (a.duration - 2 * a.sample) / 2))
            for fmt, path in (("raw", a.out + ".txt"), ("flamegraph", a.out + ".svg")):
                subprocess.run(
                    [
                        py_spy(),
                        "record",
                        "--pid",
                        str(pid),
                        "--rate",
                        str(a.rate),
                        "--duration",
                        str(int(a.sample)),
                        "--threads",
                        "--nonblocking",
                        *(["--gil"] if a.gil else []),
                        *(["--subprocesses"] if a.subprocesses else []),
                        "--format",
                        fmt,
                        "-o",
                        path,
                    ],
                    check=True,
                    capture_output=True,
                )
        t.join()
        wall = time.monotonic() - wall0
        busy1 = _machine_busy()
        result["server_cpu_pct"] = round(100 * (cb.tree_cpu_seconds(pid) - cpu0) / wall, 1)
        result["machine_busy_pct"] = round(
            100 * (busy1[0] - busy0[0]) / max(1, busy1[1] - busy0[1]), 1
        )
        print(json.dumps(result))
        if not a.wrk_only:
            print(f"wrote {a.out}.txt and {a.out}.svg")
            print(top_functions(a.out + ".txt", a.top))
    finally:
        peers.stop_all()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
