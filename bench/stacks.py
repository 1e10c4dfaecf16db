"""HTTP stacks: bare-handler ceilings of aiohttp, granian (RSGI and ASGI), uvicorn and nginx,
side by side in one run (issue 30, item 1).

Each Python server runs one tiny app from ``bench/servers/`` (``stacks_aiohttp.py``,
``stacks_rsgi.py``, ``stacks_asgi.py``) with nothing but the case in its handler, at 1 and at 2
processes:

* ``aiohttp``: asyncio's loop, as kura serves today; 2 processes forked onto the port with
  SO_REUSEPORT (kura's KURA_WORKERS does the same). ``aiohttp-uvloop``: the same on uvloop.
* ``granian-rsgi`` / ``granian-asgi``: granian (Rust, hyper on tokio) with ``--workers N``,
  ``--loop uvloop``, ``--http 1``, ``--no-ws`` (kura serves HTTP/1.1 only).
* ``uvicorn``: ``--workers N``, ``--loop uvloop``, ``--http httptools`` (its fast path).
* ``nginx``: the reference column, started by ``bench/peers.py``'s ``NginxPeer`` with
  ``worker_processes`` 1 or 2; it serves every case from files (``alias``, sendfile) and takes
  PUTs with WebDAV into files (no fsync), so its PUT columns are page-cache writes, not a dict.

Cases (wrk, ``bench/lua/get.lua`` and ``put.lua`` through ``bench/cachebench.py``):

* ``GET 1K``: a 1 KiB body from a dict (``/mem/{key}``, random key of 1000 seeded);
* ``PUT 1K``: a 1 KiB body read whole and stored in a dict (never-seen keys);
* ``GET 1M stream``: a 1 MiB body from the dict written in 64 KiB chunks (``/stream/{key}``);
* ``PUT 1M stream``: a 1 MiB body read chunk by chunk, counted, not kept (one prepared request
  sent again and again, ``bench/lua/put_one.lua``: building a fresh 1 MiB request per request
  in wrk's Lua, as ``put.lua`` does, capped every server at about the same rate here);
* ``GET 1M file``: the 1 MiB seeded file from disk (``/file/{key}``): aiohttp's
  ``FileResponse`` (sendfile on asyncio's loop), granian RSGI's ``response_file``, granian ASGI's
  ``http.response.pathsend``; uvicorn has no file extension: the app reads and sends it.

Every server is started before the first case and loaded once (a 3 s warm-up, not recorded).
Each repeat runs every case on every server back to back, the server order rotating per
repeat, so a noisy neighbour hits all of them alike. It prints one JSON object (every row with
its 1/5/15-minute load averages before and after, per-case medians of ``--repeat`` repeats, and
the ratios of each server to ``aiohttp`` at the same process count, per repeat and their
median) and a Markdown table of those medians and ratios (stderr, and ``--md-out``).

Usage (from the repository root, with ``pip install -e ".[bench]"``)::

    python -m bench.stacks --repeat 3 --duration 6 --json-out bench/results/<stamp>-stacks.json
    python -m bench.stacks --servers aiohttp,granian-rsgi --processes 2 --repeat 1 --duration 3
"""

from __future__ import annotations

import argparse
import atexit
import datetime
import http.client
import importlib.metadata
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import bench.cachebench as cb
from bench.cachebench import loadavg
from bench.peers import NginxPeer, Peer, Proc, machine_info, stop_all

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
SERVERS_DIR = os.path.join(HERE, "servers")
STACKS = ("aiohttp", "aiohttp-uvloop", "granian-rsgi", "granian-asgi", "uvicorn", "nginx")
BASELINE = "aiohttp"  # the ratios are each server / this, at the same process count
SEED_COUNT = {cb.KiB: 1000, cb.MiB: 32}  # 32 MiB of 1 MiB bodies: in memory in every process
WARMUP_SECONDS = 3


@dataclass(frozen=True)
class Case:
    """One wrk load: ``op`` of ``size``-byte bodies on the app's ``route`` (mem, stream, file)."""

    name: str
    op: str
    size: int
    route: str


CASES = (
    Case("GET 1K", "GET", cb.KiB, "mem"),
    Case("PUT 1K", "PUT", cb.KiB, "mem"),
    Case("GET 1M stream", "GET", cb.MiB, "stream"),
    Case("PUT 1M stream", "PUT", cb.MiB, "stream"),
    Case("GET 1M file", "GET", cb.MiB, "file"),
)


def log(*a: object) -> None:
    print(*a, file=sys.stderr, flush=True)


def wrk_version() -> str:
    out = subprocess.run(["wrk", "-v"], capture_output=True, text=True, check=False)
    return (out.stdout + out.stderr).split("Copyright")[0].strip()


def version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


class StackPeer(Peer):
    """One Python server on a bare app of ``bench/servers/`` (``stacks_*.py``), ``processes``
    processes on one port; its seeded blobs are the files of ``seed_dir`` (``STACKS_ROOT``)."""

    layout = "/mem/{key}"  # what ready() asks for: an unknown key answers 404 once it is up

    def __init__(self, workdir: str, stack: str, processes: int, seed_dir: str) -> None:
        self.name = f"{stack}-{processes}"
        self.stack, self.processes, self.seed_dir = stack, processes, seed_dir
        super().__init__(workdir)

    def case_layout(self, case: Case) -> str:
        return f"/{case.route}/{{key}}"

    def command(self) -> list[str]:
        py, port, n = sys.executable, str(self.port), str(self.processes)
        if self.stack in ("aiohttp", "aiohttp-uvloop"):
            cmd = [py, os.path.join(SERVERS_DIR, "stacks_aiohttp.py"), "--port", port]
            cmd += ["--processes", n] + (["--uvloop"] if self.stack == "aiohttp-uvloop" else [])
            return cmd
        if self.stack in ("granian-rsgi", "granian-asgi"):
            interface = self.stack.split("-")[1]
            return [
                *(py, "-m", "granian", "--interface", interface, "--host", "127.0.0.1"),
                *("--port", port, "--workers", n, "--loop", "uvloop", "--http", "1"),
                *("--no-ws", "--log-level", "warning", "--working-dir", SERVERS_DIR),
                f"stacks_{interface}:app",
            ]
        if self.stack == "uvicorn":
            return [
                *(py, "-m", "uvicorn", "--host", "127.0.0.1", "--port", port, "--workers", n),
                *("--loop", "uvloop", "--http", "httptools", "--no-access-log", "--lifespan"),
                *("off", "--log-level", "warning", "--app-dir", SERVERS_DIR, "stacks_asgi:app"),
            ]
        raise ValueError(f"unknown stack {self.stack}")

    def key_path(self, key: str) -> str | None:
        return None  # PUTs land in a dict (or are counted): no file to delete

    def start(self) -> None:
        env = dict(os.environ, STACKS_ROOT=self.seed_dir)
        logfile = os.path.join(self.dir, "stdout.log")
        self.proc = Proc(self.name, self.command(), env=env, logfile=logfile)

    def describe(self) -> str:
        cmd = [os.path.relpath(c, REPO) if c.startswith(REPO) else c for c in self.command()]
        cmd[0] = "python"
        return shlex.join(cmd)


class NginxStack(NginxPeer):
    """``bench/peers.py``'s nginx with ``workers`` worker processes, its store holding the
    seeded files (hard links): every case's URL is ``/cache/{key}``."""

    def __init__(self, workdir: str, workers: int, seed_dir: str) -> None:
        super().__init__(workdir, str(workers), name=f"nginx-{workers}")
        self.stack, self.processes = "nginx", workers
        for name in os.listdir(seed_dir):
            os.link(os.path.join(seed_dir, name), os.path.join(self.store, name))

    def case_layout(self, case: Case) -> str:
        return self.layout


def seed_files(seed_dir: str) -> dict[int, list[str]]:
    """Write ``SEED_COUNT`` content-addressed blobs per size into ``seed_dir`` (file name = key =
    sha256 of the body, the bodies ``cachebench.BlobSet(size, "seed")`` makes); size -> keys."""
    keys: dict[int, list[str]] = {}
    for size, count in SEED_COUNT.items():
        blobs = cb.BlobSet(size, "seed")
        keys[size] = []
        for i in range(count):
            key = blobs.key(i)
            with open(os.path.join(seed_dir, key), "wb") as f:
                f.write(blobs.body(i))
            keys[size].append(key)
    return keys


def check(peer: Any, keys: dict[int, list[str]]) -> None:
    """One request of every case, answered as the case expects (the body byte for byte for a
    GET, 2xx for a PUT); raises RuntimeError otherwise."""
    for case in CASES:
        target = cb.Target(f"http://127.0.0.1:{peer.port}", peer.case_layout(case))
        blobs = cb.BlobSet(case.size, "seed")
        conn = target.connection()
        try:
            if case.op == "GET":
                conn.request("GET", target.path(keys[case.size][0]))
                want = blobs.body(0)
            else:
                body = cb.BlobSet(case.size, "check").body(0)
                key = cb.BlobSet(case.size, "check").key(0)
                conn.request("PUT", target.path(key), body=body)
                want = None
            response = conn.getresponse()
            got = response.read()
        except (OSError, http.client.HTTPException) as exc:
            raise RuntimeError(f"{peer.name} {case.name}: {exc}") from exc
        finally:
            conn.close()
        if not 200 <= response.status < 300 or (want is not None and got != want):
            raise RuntimeError(f"{peer.name} {case.name}: {response.status}, {len(got)} bytes")
        if case.op == "PUT" and isinstance(peer, NginxStack):
            peer.cleanup([key])


def run_case(peer: Any, case: Case, keys: dict[int, list[str]], a: argparse.Namespace) -> dict:
    target = cb.Target(f"http://127.0.0.1:{peer.port}", peer.case_layout(case), label=peer.name)
    conns = a.conns.get(case.size, cb.default_conns(case.size))
    if case.op == "GET":
        row = cb.run_get(
            target, keys[case.size], case.size, threads=a.threads, conns=conns, duration=a.duration
        )
    elif case.route == "stream":
        row = cb.run_put_one(target, case.size, threads=a.threads, conns=conns, duration=a.duration)
        peer.cleanup([cb.BlobSet(case.size, "put-one").key(0)])
    else:
        row = cb.run_put(
            target,
            case.size,
            threads=a.threads,
            conns=conns,
            duration=a.duration,
            cleanup=peer.cleanup,
        )
        subprocess.run(["sync"], check=False)  # nginx's PUT files: written back before the next
    return dict(row, case=case.name, server=peer.name, stack=peer.stack, processes=peer.processes)


def summarise(rows: list[dict], names: list[str], processes: dict[str, int]) -> dict:
    """Per case and server: the median req/s, MiB/s, p50 and p99 ms over the repeats, every
    repeat's req/s, and the ratio to ``aiohttp`` at the same process count (per repeat, same
    repeat side by side, and their median; > 1 = faster than aiohttp)."""
    out: dict[str, Any] = {}
    for case in CASES:
        entry: dict[str, Any] = {}
        mine = [r for r in rows if r["case"] == case.name]
        if not mine:
            continue
        for name in names:
            of = [r for r in mine if r["server"] == name]
            if not of:
                continue
            n = processes[name]
            base = {r["rep"]: r["rps"] for r in mine if r["server"] == f"{BASELINE}-{n}"}
            per_rep = [round(r["rps"] / base[r["rep"]], 2) for r in of if base.get(r["rep"])]
            entry[name] = {
                "rps": statistics.median(r["rps"] for r in of),
                "MiBps": statistics.median(r["MiBps"] for r in of),
                "p50_ms": statistics.median(r["p50_ms"] for r in of),
                "p99_ms": statistics.median(r["p99_ms"] for r in of),
                "repeats_rps": [r["rps"] for r in of],
                "ok": all(r["ok"] for r in of),
                f"over_{BASELINE}": {
                    "median": statistics.median(per_rep) if per_rep else None,
                    "repeats": per_rep,
                },
            }
        out[case.name] = entry
    return out


def table(summary: dict, names: list[str], processes: list[int]) -> str:
    """Markdown: per process count, one row per case, one column per server: the median req/s
    and, beside it, x the median of the per-repeat ratios to aiohttp at that process count."""
    lines = []
    for n in processes:
        cols = [name for name in names if name.endswith(f"-{n}")]
        lines.append(
            f"{n} process(es): median req/s, x{BASELINE}-{n} (median of per-repeat ratios)"
        )
        lines.append("")
        lines.append("| case | " + " | ".join(cols) + " |")
        lines.append("|---|" + "---|" * len(cols))
        for case, entry in summary.items():
            cells = []
            for name in cols:
                e = entry.get(name)
                if e is None:
                    cells.append("-")
                    continue
                r = e[f"over_{BASELINE}"]["median"]
                flag = "" if e["ok"] else " (!errors)"
                ratio = "" if name.startswith(f"{BASELINE}-") or r is None else f" x{r:.2f}"
                cells.append(f"{e['rps']:,.0f}{ratio}{flag}")
            lines.append(f"| {case} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--servers", default=",".join(STACKS), help=f"any of {', '.join(STACKS)}")
    p.add_argument("--processes", default="1,2", help="process counts (each server at each)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--duration", type=float, default=6, help="seconds per wrk case")
    p.add_argument("--threads", type=int, default=2, help="wrk threads")
    p.add_argument(
        "--connections",
        default="1K=32,1M=8",
        help="wrk connections: one number for every case, or per body size as in cachebench "
        "(default 32 for 1 KiB, 8 for 1 MiB)",
    )
    p.add_argument(
        "--cases",
        default=",".join(c.name for c in CASES),
        help="comma-separated case names (default: all)",
    )
    p.add_argument("--json-out", help="write the JSON object to this file too")
    p.add_argument("--md-out", help="write the Markdown table to this file too")
    a = p.parse_args(argv)
    if a.connections.isdigit():
        a.conns = dict.fromkeys(SEED_COUNT, int(a.connections))
    else:
        a.conns = cb.parse_size_map(a.connections)
    return a


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    stacks = [s.strip() for s in a.servers.split(",") if s.strip()]
    unknown = [s for s in stacks if s not in STACKS]
    if unknown:
        raise SystemExit(f"unknown servers: {', '.join(unknown)} (known: {', '.join(STACKS)})")
    processes = [int(n) for n in a.processes.split(",") if n.strip()]
    cases = [c for c in CASES if c.name in {x.strip() for x in a.cases.split(",")}]
    if not cases:
        raise SystemExit(
            f"no known case in {a.cases!r} (known: {', '.join(c.name for c in CASES)})"
        )
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    atexit.register(stop_all)

    work = tempfile.mkdtemp(prefix="kura-stacks-")
    run: dict[str, Any] = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": shlex.join(["python", "-m", "bench.stacks", *(argv or sys.argv[1:])]),
        "machine": machine_info(),
        "load_start": loadavg(),
        "settings": {k: v for k, v in vars(a).items() if k not in ("json_out", "md_out", "conns")},
        "versions": {
            d: version(d) for d in ("aiohttp", "granian", "uvicorn", "httptools", "uvloop")
        },
        "wrk": wrk_version(),
    }
    try:
        seed_dir = os.path.join(work, "seed")
        os.makedirs(seed_dir)
        keys = seed_files(seed_dir)
        peers: list[Any] = []
        for n in processes:
            for stack in stacks:
                if stack == "nginx":
                    peer: Any = NginxStack(work, n, seed_dir)
                else:
                    peer = StackPeer(work, stack, n, seed_dir)
                peer.start()
                peer.ready()
                check(peer, keys)
                peers.append(peer)
                log(f"[{peer.name}] up on port {peer.port} (pid {peer.proc.pid})")
        run["servers"] = {p.name: p.describe() for p in peers}
        warm = argparse.Namespace(**{**vars(a), "duration": WARMUP_SECONDS})
        for p in peers:
            run_case(p, CASES[0], keys, warm)

        rows: list[dict] = []
        for rep in range(a.repeat):
            order = peers[rep % len(peers) :] + peers[: rep % len(peers)]
            for case in cases:
                for p in order:
                    row = dict(run_case(p, case, keys, a), rep=rep)
                    rows.append(row)
                    log(
                        f"rep {rep} {case.name:14} {p.name:18} {row['rps']:>10,.0f} req/s "
                        f"{'ok' if row['ok'] else 'ERRORS'} load {row['load_before'][0]:.2f}"
                    )
        run["load_end"] = loadavg()
        run["rows"] = rows
        names = [p.name for p in peers]
        run["summary"] = summarise(rows, names, {p.name: p.processes for p in peers})
    finally:
        stop_all()
        shutil.rmtree(work, ignore_errors=True)
    md = table(run["summary"], names, processes)
    loads = " / ".join(f"{x:.2f}" for x in run["load_start"])
    loads_end = " / ".join(f"{x:.2f}" for x in run["load_end"])
    md += f"\nLoad average (1/5/15 min): start {loads}, end {loads_end}\n"
    text = json.dumps(run, indent=1)
    print(text)
    log("\n" + md)
    if a.json_out:
        with open(a.json_out, "w") as f:
            f.write(text + "\n")
    if a.md_out:
        with open(a.md_out, "w") as f:
            f.write(md)


if __name__ == "__main__":
    t0 = time.monotonic()
    main()
    log(f"took {time.monotonic() - t0:.0f} s")
