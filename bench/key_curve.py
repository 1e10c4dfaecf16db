#!/usr/bin/env python3
"""GET 1 KiB latency, req/s and RSS against the number of stored keys: kura, nginx, turbo.

    .venv/bin/python bench/key_curve.py                       # 10^3, 10^5, 10^6 keys, 3 repeats
    .venv/bin/python bench/key_curve.py --quick               # smoke: 10^3, 10^4, 1 repeat, 3 s
    .venv/bin/python bench/key_curve.py --counts 100 --repeat 1 --duration 1   # the unit smoke

For each count N: ``bench.seed`` writes N artifacts of 1 KiB (Nx keys ``k0 .. k{N-1}``) into a
fresh data dir through kura's storage layer, as blob files, or with ``--inline`` inside their
index rows (what kura does with a PUT of at most ``KURA_INLINE_MAX_BYTES``, 16 KiB by default).
Servers (``--servers``), each on an OS-chosen port, timed to ready:

* ``kura``: ``kura serve`` on that data dir, default settings as ``bench.peers`` sets them.
* ``kura-nohot``: the same with ``KURA_HOT_CACHE_BYTES=0`` on a copy of the data dir (SQLite
  files copied, blob files hard-linked), so every GET takes the index lookup.
* ``nginx``: serves N plain files via ``alias``: kura's own blob tree (``blobs/ab/cd/<file>``,
  2-level fanout), or with ``--inline`` a tree ``ab/cd/k{i}`` written here.
* ``turbo``: turborepo-remote-cache 2.12.0, local storage, which keeps artifact ``<id>`` of team
  ``<team>`` at ``<STORAGE_PATH>/<team>/<id>`` (fs-blob-store;
  dist/plugins/remote-cache/storage/index.js ``getArtifactPath``): one directory of N hard links
  to nginx's files.

Load: wrk (``bench/lua/get.lua``, 2 threads, ``--conns`` connections) for ``--duration`` s per
case, each request a key drawn uniformly at random from ALL N stored keys (not a hot few).
After each case ``--check`` random keys are fetched again and compared byte for byte with
``bench.seed.body_of``; for kura the hot-cache hit share of the case comes from /metrics. Each
repeat runs the servers in a rotating order (a different one first each time). RSS (VmRSS,
summed over the server's process tree) is read after /ready and after each case; the peak is
VmHWM at the end. One JSON line per case and per server (``--json-out``), a Markdown table of
medians with every repeat in brackets (``--md-out``, also printed).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import cachebench as cb
import peers
from bench.seed import body_of, key_of, seed
from kit.wait import wait_until

SIZE = 1024
BASE_MS = 1_700_000_000_000
SERVERS = ("kura", "kura-nohot", "nginx", "turbo")
log = cb.log


def du_mib(path: str) -> float:
    """Disk space under ``path`` (``du -sk``), in MiB."""
    return round(int(subprocess.check_output(["du", "-sk", path]).split()[0]) / 1024, 1)


def tree_kib(pid: int, field: str) -> int:
    """``field`` (VmRSS, VmHWM) of ``pid`` and its descendants, in KiB."""
    return sum(cb._status_kib(p, field) for p in cb._children(pid))


def wait_ready(base: str, proc: peers.Proc, timeout: float) -> float:
    """Seconds until ``GET /ready`` answers 200; raises RuntimeError on exit or timeout."""
    start = time.monotonic()

    def ready() -> bool:
        with urllib.request.urlopen(base + "/ready", timeout=5) as r:
            return bool(r.status == 200)

    def exited() -> bool:
        return proc.p.poll() is not None

    if wait_until(ready, timeout, interval=0.1, ignoring=(OSError,), give_up=exited):
        return time.monotonic() - start
    if exited():
        raise RuntimeError(f"{proc.name} exited with {proc.p.returncode}")
    raise RuntimeError(f"{proc.name} not ready after {timeout} s")


def blob_names(blobs_dir: str) -> list[str]:
    """Relative path of artifact i's file, indexed by i (seed: version_ms = BASE_MS + i)."""
    names: dict[int, str] = {}
    for a in os.listdir(blobs_dir):
        if len(a) != 2:
            continue
        for b in os.listdir(os.path.join(blobs_dir, a)):
            for name in os.listdir(os.path.join(blobs_dir, a, b)):
                version = name.partition(".")[2].partition("-")[0]
                names[int(version) - BASE_MS] = f"{a}/{b}/{name}"
    return [names[i] for i in range(len(names))]


def check_bodies(target: cb.Target, keys: list[str], n: int, rng: random.Random) -> int:
    """GET ``n`` random keys on one connection; return how many bodies differ from body_of."""
    wrong = 0
    conn = target.connection()
    try:
        for i in rng.sample(range(len(keys)), min(n, len(keys))):
            conn.request("GET", target.path(keys[i]), headers=target.header_dict())
            r = conn.getresponse()
            if r.status != 200 or r.read() != body_of(i, SIZE):
                wrong += 1
    finally:
        conn.close()
    return wrong


class KuraNoHot(peers.KuraPeer):
    """kura with its in-memory hot cache off: every GET takes the SQLite lookup."""

    name = "kura-nohot"


def hot_lookups(base: str) -> dict[str, float]:
    """kura's ``kura_hot_cache_lookups_total`` by result, from ``GET /metrics``."""
    out: dict[str, float] = {}
    with urllib.request.urlopen(base + "/metrics", timeout=30) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("kura_hot_cache_lookups_total{"):
                out[line.split('"')[1]] = float(line.rsplit(" ", 1)[1])
    return out


def link_copy(src: str, dst: str) -> None:
    """A second data dir: the SQLite files copied, every blob file hard-linked (GETs never
    write a blob file, so two nodes can share the inodes)."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("blobs"))
    if os.path.isdir(os.path.join(src, "blobs")):
        blobs = os.path.join(src, "blobs")
        shutil.copytree(blobs, os.path.join(dst, "blobs"), copy_function=os.link)


def write_tree(root: str, count: int) -> list[str]:
    """Artifact i's body as the plain file ``root/ab/cd/k{i}`` (ab, cd: the key's SHA-256, a
    2-level fanout like kura's); return the relative paths, indexed by i."""
    names, made = [], set()
    for i in range(count):
        h = hashlib.sha256(key_of(i).encode()).hexdigest()
        bucket = f"{h[:2]}/{h[2:4]}"
        if bucket not in made:
            os.makedirs(os.path.join(root, bucket), exist_ok=True)
            made.add(bucket)
        names.append(f"{bucket}/{key_of(i)}")
        with open(os.path.join(root, names[-1]), "wb") as f:
            f.write(body_of(i, SIZE))
    os.sync()
    return names


def run_count(a: argparse.Namespace, count: int, root: str, emit) -> None:
    work = os.path.join(root, f"n{count}")
    kura = peers.KuraPeer(work)
    t0 = time.monotonic()
    seed(Path(kura.data_dir), Path(kura.tmp_dir), count, SIZE, BASE_MS, inline=a.inline)
    seed_s = time.monotonic() - t0
    t0 = time.monotonic()
    if a.inline:  # the peers' files: a tree of their own
        blobs = os.path.join(work, "files")
        need = {"nginx", "turbo"} & set(a.servers)
        names = write_tree(blobs, count) if need else [key_of(i) for i in range(count)]
    else:  # the peers serve kura's blob files
        blobs = os.path.join(kura.data_dir, "blobs")
        names = blob_names(blobs)
    if len(names) != count:
        raise RuntimeError(f"seeded {count} artifacts, found {len(names)} blob files")
    servers: dict[str, peers.Peer] = {}
    for name in a.servers:
        if name == "kura":
            servers[name] = kura
        elif name == "kura-nohot":
            p = servers[name] = KuraNoHot(work, env={"KURA_HOT_CACHE_BYTES": "0"})
            link_copy(kura.data_dir, p.data_dir)
        elif name == "nginx":
            p = servers[name] = peers.NginxPeer(work)
            os.rmdir(p.store)
            p.store = blobs  # alias /cache/ -> the tree of plain files
        elif name == "turbo":
            p = servers[name] = peers.TurboPeer(work)
            team = os.path.join(p.store, "bench")
            os.makedirs(team)
            for i, blob in enumerate(names):
                os.link(os.path.join(blobs, blob), os.path.join(team, f"k{i}"))
        else:
            raise SystemExit(f"unknown server {name!r}: pick from {', '.join(SERVERS)}")
    link_s = time.monotonic() - t0
    kura_keys = [f"k{i}" for i in range(count)]
    keys = {"kura": kura_keys, "kura-nohot": kura_keys, "nginx": names, "turbo": kura_keys}
    started: dict[str, dict] = {}
    order = list(servers)
    try:
        for name, p in servers.items():
            if name.startswith("kura"):
                p.layout = "/v1/cache/{key}"  # bench.seed writes Nx artifacts
            p.start()
            assert p.proc is not None
            if name.startswith("kura"):
                ready_s = wait_ready(p.target.root, p.proc, a.ready_timeout)
            else:
                t0 = time.monotonic()
                p.ready()
                ready_s = time.monotonic() - t0
            started[name] = {
                "ready_s": round(ready_s, 2),
                "rss_start_kib": tree_kib(p.proc.pid, "VmRSS"),
            }
            if check_bodies(p.target, keys[name], 5, random.Random(0)):
                raise RuntimeError(f"[{name}] a seeded body does not read back")
        log(
            f"[n={count}] seeded in {seed_s:.1f} s, names+links in {link_s:.1f} s, ready: {started}"
        )
        rng = random.Random(count)
        for rep in range(a.repeat):
            for name in order:
                p = servers[name]
                assert p.proc is not None
                load1 = os.getloadavg()[0]
                hot0 = hot_lookups(p.target.root) if name.startswith("kura") else {}
                row = cb.run_get(p.target, keys[name], SIZE, conns=a.conns, duration=a.duration)
                if hot0:
                    hot = {k: v - hot0.get(k, 0) for k, v in hot_lookups(p.target.root).items()}
                    done = hot.get("hit", 0) + hot.get("miss", 0)
                    row["hot_cache_hit_ratio"] = round(hot.get("hit", 0) / done, 3) if done else 0
                wrong = check_bodies(p.target, keys[name], a.check, rng)
                row.update(
                    kind="case",
                    server=name,
                    keys=count,
                    repeat=rep,
                    order=list(order),
                    load1=round(load1, 2),
                    bodies_checked=min(a.check, count),
                    bodies_wrong=wrong,
                    rss_after_load_mib=round(tree_kib(p.proc.pid, "VmRSS") / 1024, 1),
                )
                row["ok"] = row["ok"] and wrong == 0
                emit(row)
            order = order[1:] + order[:1]  # rotate: each server goes first in turn
        for name, p in servers.items():
            assert p.proc is not None
            emit(
                {
                    "kind": "server",
                    "server": name,
                    "keys": count,
                    "kura_bodies": "inline" if a.inline else "files",
                    "describe": p.describe(),
                    "seed_s": round(seed_s, 1),
                    "links_s": round(link_s, 1),
                    "ready_s": started[name]["ready_s"],
                    "rss_start_mib": round(started[name]["rss_start_kib"] / 1024, 1),
                    "rss_end_mib": round(tree_kib(p.proc.pid, "VmRSS") / 1024, 1),
                    "rss_peak_mib": round(tree_kib(p.proc.pid, "VmHWM") / 1024, 1),
                    "data_mib": du_mib(kura.store) if name == "kura" else None,
                }
            )
    finally:
        for p in servers.values():
            if p.proc is not None:
                p.proc.stop()
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)


def _cell(values: list[float], fmt: str) -> str:
    if not values:
        return ""
    inner = ", ".join(format(v, fmt) for v in values)
    return f"{format(statistics.median(values), fmt)} ({inner})"


def table(rows: list[dict]) -> str:
    """Markdown: one line per (keys, server), medians with every repeat in brackets."""
    out = [
        "| keys | server | req/s | p50 ms | p99 ms | errors | bodies wrong / checked "
        "| RSS start / after load / peak MiB | ready s | hot-cache hits | load (1 min) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    servers = {(r["keys"], r["server"]): r for r in rows if r["kind"] == "server"}
    for keys, name in sorted(servers, key=lambda k: (k[0], SERVERS.index(k[1]))):
        cases = [
            r for r in rows if r["kind"] == "case" and (r["keys"], r["server"]) == (keys, name)
        ]
        s = servers[(keys, name)]
        shown = f"{name} ({s.get('kura_bodies', 'files')})" if name.startswith("kura") else name
        out.append(
            f"| {keys:,} | {shown} | {_cell([r['rps'] for r in cases], ',.0f')} "
            f"| {_cell([r['p50_ms'] for r in cases], '.2f')} "
            f"| {_cell([r['p99_ms'] for r in cases], '.2f')} "
            f"| {sum(r['errors'] for r in cases)} "
            f"| {sum(r['bodies_wrong'] for r in cases)} / {sum(r['bodies_checked'] for r in cases)} "
            f"| {s['rss_start_mib']} / {max(r['rss_after_load_mib'] for r in cases)} "
            f"/ {s['rss_peak_mib']} | {s['ready_s']} "
            f"| {_cell([r['hot_cache_hit_ratio'] for r in cases if 'hot_cache_hit_ratio' in r], '.2f')} "
            f"| {', '.join(str(r['load1']) for r in cases)} |"
        )
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--counts", default="1000,100000,1000000", help="stored-key counts, commas")
    ap.add_argument("--quick", action="store_true", help="10^3,10^4 keys, 1 repeat, 3 s cases")
    ap.add_argument("--servers", default=",".join(SERVERS), help="subset of " + ",".join(SERVERS))
    ap.add_argument("--inline", action="store_true", help="seed kura's bodies inline, not as files")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--duration", type=float, default=10, help="seconds of wrk per case")
    ap.add_argument("--conns", type=int, default=32, help="wrk connections (2 threads)")
    ap.add_argument("--check", type=int, default=200, help="bodies compared after each case")
    ap.add_argument("--ready-timeout", type=float, default=900)
    ap.add_argument("--root", help="work directory (default: a temp dir, removed)")
    ap.add_argument("--keep", action="store_true", help="keep each count's data dirs")
    ap.add_argument("--json-out")
    ap.add_argument("--md-out")
    ap.add_argument("--table-from", help="print the table of an earlier --json-out file")
    a = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, peers._on_signal)  # SystemExit: the finally blocks stop servers
    if a.table_from:
        with open(a.table_from) as f:
            print(table([json.loads(line) for line in f if line.strip()]), end="")
        return 0
    if a.quick:
        a.counts, a.repeat, a.duration = "1000,10000", 1, 3
    a.servers = a.servers.split(",")
    counts = [int(float(c)) for c in a.counts.split(",")]
    root = a.root or tempfile.mkdtemp(prefix="kura-key-curve-")
    rows: list[dict] = []
    out = open(a.json_out, "w") if a.json_out else None  # noqa: SIM115 (closed below)

    def emit(row: dict) -> None:
        rows.append(row)
        line = json.dumps(row, sort_keys=True)
        print(line, flush=True)
        if out:
            out.write(line + "\n")
            out.flush()

    emit(
        {"kind": "run", "machine": peers.machine_info(), "counts": counts, "load": os.getloadavg()}
    )
    try:
        for count in counts:
            run_count(a, count, root, emit)
    finally:
        peers.stop_all()
        if out:
            out.close()
        if not a.root:
            shutil.rmtree(root, ignore_errors=True)
    md = table(rows)
    print(md, end="")
    if a.md_out:
        with open(a.md_out, "w") as f:
            f.write(md)
    bad = [r for r in rows if r["kind"] == "case" and not r["ok"]]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
