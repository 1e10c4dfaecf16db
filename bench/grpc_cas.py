"""REAPI over gRPC: kura's ByteStream and FindMissingBlobs against kura's own HTTP ``/cas/`` path
and against BuildGrid's CAS server, side by side in one run, on loopback.

Starts one ``kura serve`` (``KURA_GRPC_PORT``, disk store under a temp dir) and, when its ``bgd``
is found, one BuildGrid ``bgd server start`` with a CAS + ByteStream instance ``""`` on its disk
storage (BuildGrid is not a project dependency: install it in its own venv, see
``bench/README.md``). Every case runs against every server in the same repeat, the order rotating
per repeat; the medians of ``--repeat`` repeats and the ratios are printed as one JSON object.

Cases (sizes 1 KiB, 1 MiB, 64 MiB):

* ``write``: ByteStream.Write of never-seen blobs (``--write-chunk-bytes`` per message) and, on
  kura, HTTP ``PUT /cache/cas/<sha256>`` of never-seen blobs. Blobs are made and hashed before
  the clock starts.
* ``read``: ByteStream.Read / HTTP ``GET /cache/cas/<sha256>`` cycling over a seeded set (hot in
  the page cache); each read checks its byte count.
* 1 KiB also with ``--concurrency`` workers, each with its own channel / connection.
* ``batch_update``: BatchUpdateBlobs of ``--batch-blobs`` never-seen 1 KiB blobs per call,
  ``--batch-calls`` calls; ``batch_read``: BatchReadBlobs of as many seeded 1 KiB blobs (each
  answer's status and byte count checked). Reported as the median milliseconds per call.
* ``find_missing``: FindMissingBlobs for ``--find-digests`` digests, half of them present
  (seeded with BatchUpdateBlobs); the answer's missing count is checked.

Clients, same class for both protocols: synchronous, blocking, one connection per worker.
gRPC: grpcio's channel with the REAPI stubs kura generates (``kura.protos``, as tests/grpc_api);
HTTP: the standard library's ``http.client`` keep-alive connection. Absolute numbers on a shared
2-core box drift; compare the ratios, taken within one run.

Usage::

    .venv/bin/python -m bench.grpc_cas                        # ~2 min, 3 repeats
    .venv/bin/python -m bench.grpc_cas --repeat 1 --ops-scale 0.2   # smoke run
    .venv/bin/python -m bench.grpc_cas --bgd ../bgvenv/bin/bgd --json-out out.json
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes.util
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from bench.cachebench import loadavg
from bench.cas_client import Client, GrpcClient, HttpClient
from bench.peers import machine_info
from kura.protos.build.bazel.remote.execution.v2 import (
    remote_execution_pb2 as reapi,
)
from kura_harness.launch.node import kura_env, spawn_kura
from kura_harness.launch.process import free_port, stop

KiB, MiB = 1024, 1024 * 1024
SIZES = {"1K": KiB, "1M": MiB, "64M": 64 * MiB}
# operations per case and worker count at --ops-scale 1 (a 64 MiB case is a few transfers)
OPS = {"1K": 300, "1M": 40, "64M": 3}
SEEDED = {"1K": 100, "1M": 20, "64M": 2}


def log(*a: object) -> None:
    print(*a, file=sys.stderr, flush=True)


# ----------------------------------------------------------------- servers


def start_kura(root: Path, preload: str | None = None) -> tuple[Any, str, str]:
    """One ``kura serve`` with gRPC; ``preload``: a library for ``LD_PRELOAD`` (``--eatmydata``)."""
    port = free_port()
    env = kura_env(root / "data", root / "tmp", {"grpc_port": port, "log_level": "WARNING"})
    if preload:
        env["LD_PRELOAD"] = preload
    node = spawn_kura(env, root / "kura.log", start_new_session=True)
    return node.proc, node.url, f"127.0.0.1:{port}"


# thread-pool-size / maximum-concurrent-rpcs: above the default (5 x CPUs = 10 here), so the
# 8 concurrent 1 KiB workers are never refused (BuildGrid answers RESOURCE_EXHAUSTED past it).
BGD_CONFIG = """\
thread-pool-size: 16
maximum-concurrent-rpcs: 64
server:
  - !channel
    address: "127.0.0.1:{port}"
    insecure-mode: true
authorization:
  method: none
storages:
  - !disk-storage &main-storage
    path: {path}
instances:
  - name: ""
    services:
      - !cas
        storage: *main-storage
      - !bytestream
        storage: *main-storage
"""


def start_bgd(bgd: str, root: Path) -> tuple[subprocess.Popen[bytes], str]:
    """BuildGrid's CAS + ByteStream on its disk storage (the documented minimal CAS server:
    https://buildgrid.build/user/using_cas_server.html), ready when its channel is."""
    port = free_port()
    (root / "cas").mkdir(parents=True)
    config = root / "bgd.yml"
    config.write_text(BGD_CONFIG.format(port=port, path=root / "cas"))
    with (root / "bgd.log").open("w") as out:
        proc = subprocess.Popen(
            [bgd, "server", "start", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=root,
            start_new_session=True,
        )
    return proc, f"127.0.0.1:{port}"


def bgd_version(bgd: str) -> str:
    python = Path(bgd).with_name("python")
    out = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('buildgrid'))"],
        capture_output=True,
        text=True,
        check=False,
    )
    return out.stdout.strip() or "?"


# ----------------------------------------------------------------- measuring


def blob(size: int, tag: bytes) -> tuple[str, bytes]:
    data = tag.ljust(32, b"\0") + os.urandom(size - 32) if size > 64 else (tag * size)[:size]
    return hashlib.sha256(data).hexdigest(), data


def settle_disk() -> None:
    """sync(2) before a timed case, outside its clock: the servers share one disk, and on ext4
    (``data=ordered``) the next fsync's journal commit also writes out the data other
    processes left dirty. Without it a syncing server's case paid for the writes the server
    before it in the rotation left in the page cache (BuildGrid's, which never syncs): kura's
    1 MiB gRPC writes ran at 42 to 52 MiB/s without it (5 repeats) and 55 to 61 with it (3)."""
    os.sync()


def timed(clients: list[Client], op: str, items: list[Any]) -> float:
    """Seconds to run ``op`` on every item, item ``i`` on worker ``i % len(clients)``."""
    errors: list[BaseException] = []
    settle_disk()

    def work(client: Client, mine: list[Any]) -> None:
        fn: Callable[[Any], None] = getattr(client, op)
        try:
            for item in mine:
                fn(item)
        except BaseException as exc:  # surfaced below, after the clock
            errors.append(exc)

    n = len(clients)
    t0 = time.perf_counter()
    if n == 1:
        work(clients[0], items)
    else:
        threads = [threading.Thread(target=work, args=(clients[i], items[i::n])) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    elapsed = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return elapsed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--ops-scale", type=float, default=1.0, help="multiplies the op counts")
    p.add_argument("--concurrency", type=int, default=8, help="workers for the 1 KiB cases")
    p.add_argument("--write-chunk-bytes", type=int, default=MiB, help="ByteStream.Write message")
    p.add_argument("--find-digests", type=int, default=10_000)
    p.add_argument("--find-calls", type=int, default=5, help="FindMissingBlobs calls per repeat")
    p.add_argument("--batch-blobs", type=int, default=100, help="1 KiB blobs per batch call")
    p.add_argument("--batch-calls", type=int, default=20, help="batch calls per repeat and op")
    p.add_argument(
        "--only", default="", help="comma-separated case prefixes to run (e.g. write,batch)"
    )
    p.add_argument("--bgd", default=os.environ.get("BGD") or shutil.which("bgd") or "bgd")
    p.add_argument("--json-out", type=Path)
    p.add_argument(
        "--eatmydata",
        nargs="?",
        const="",
        metavar="LIB",
        help="also run a kura_grpc_nosync: a second kura with LIB (default: the system's "
        "libeatmydata, Debian package eatmydata) preloaded, so every fsync is a no-op. Not a "
        "configuration: it measures what kura's durability costs beside a server that does "
        "not fsync",
    )
    a = p.parse_args()

    run: dict[str, Any] = {"machine": machine_info(), "load_start": loadavg()}
    work = Path(tempfile.mkdtemp(prefix="kura-grpc-bench-"))
    procs: list[Any] = []
    clients: dict[str, list[Client]] = {}
    try:
        kura_proc, kura_url, kura_grpc = start_kura(work / "kura")
        procs.append(kura_proc)
        targets = {"kura_grpc": kura_grpc}
        if a.eatmydata is not None:
            lib = a.eatmydata or ctypes.util.find_library("eatmydata")
            if not lib:
                raise SystemExit("--eatmydata: libeatmydata not found (apt install eatmydata)")
            nosync_proc, _url, targets["kura_grpc_nosync"] = start_kura(work / "kura-nosync", lib)
            procs.append(nosync_proc)
        bgd = a.bgd if shutil.which(a.bgd) else None
        if bgd:
            bgd_proc, bgd_target = start_bgd(bgd, work / "bgd")
            procs.append(bgd_proc)
            targets["buildgrid"] = bgd_target
        else:
            log(f"buildgrid skipped: no bgd at {a.bgd} (pip install buildgrid in its own venv)")
        workers = max(1, a.concurrency)
        for name, target in targets.items():
            clients[name] = [GrpcClient(target, a.write_chunk_bytes) for _ in range(workers)]
        clients["kura_http"] = [HttpClient(kura_url) for _ in range(workers)]
        grpc_servers = list(targets)
        servers = [*grpc_servers, "kura_http"]
        run["versions"] = {
            "kura": kura_rev(),
            "grpcio": grpc.__version__,
            "buildgrid": bgd_version(bgd) if bgd else None,
        }
        # Names, not this machine's paths: the file is committed.
        run["settings"] = {
            **vars(a),
            "json_out": a.json_out.name if a.json_out else None,
            "bgd": Path(a.bgd).name,
            "eatmydata": Path(a.eatmydata).name if a.eatmydata else a.eatmydata,
        }

        # seed: read sets (kura via gRPC, visible to HTTP as the same cas/ key) and find sets
        seeded: dict[str, list[tuple[str, int]]] = {}
        for label, size in SIZES.items():
            blobs = [blob(size, f"seed-{label}-{i}".encode()) for i in range(SEEDED[label])]
            for name in grpc_servers:
                for b in blobs:
                    clients[name][0].write(b)
            seeded[label] = [(sha, len(d)) for sha, d in blobs]
        half = a.find_digests // 2
        present = [blob(64, f"find-present-{i:06d}".encode()) for i in range(half)]
        absent = [blob(64, f"find-absent-{i:06d}".encode()) for i in range(a.find_digests - half)]
        for name in grpc_servers:
            for i in range(0, half, 1000):
                clients[name][0].batch_update(present[i : i + 1000])
        digests = [reapi.Digest(hash=sha, size_bytes=len(d)) for sha, d in present + absent]
        clients["kura_http"][0].read(seeded["1K"][0])  # the HTTP path sees the gRPC writes

        cases = [
            (op, label, c)
            for op in ("write", "read")
            for label, c in (("1K", 1), ("1K", workers), ("1M", 1), ("64M", 1))
        ]
        only = tuple(x for x in a.only.split(",") if x)

        def wanted(case: str) -> bool:
            return not only or case.startswith(only)

        cases = [c for c in cases if wanted(f"{c[0]} {c[1]}")]
        rows: list[dict[str, Any]] = []
        for rep in range(a.repeat):
            order = servers[rep % len(servers) :] + servers[: rep % len(servers)]
            for op, label, c in cases:
                n = max(c, int(OPS[label] * a.ops_scale) * (2 if c > 1 else 1))
                for name in order:
                    if op == "write":
                        tag = f"w-{name}-{rep}-{label}-{c}-".encode()
                        items: list[Any] = [blob(SIZES[label], tag + b"%d" % i) for i in range(n)]
                    else:
                        items = [seeded[label][i % len(seeded[label])] for i in range(n)]
                    before = loadavg()
                    seconds = timed(clients[name][:c], op, items)
                    del items
                    row = {
                        "repeat": rep,
                        "server": name,
                        "case": f"{op} {label} c{c}",
                        "ops": n,
                        "seconds": round(seconds, 4),
                        "req_s": round(n / seconds, 1),
                        "mib_s": round(n * SIZES[label] / seconds / MiB, 2),
                        "load_before": before,
                        "load_after": loadavg(),
                    }
                    rows.append(row)
                    log(json.dumps(row))
            for name in [g for g in order if g in grpc_servers]:
                for op in ("batch_update", "batch_read"):
                    if not wanted(op):
                        continue
                    row = batch_case(a, clients[name][0], op, rep, name, seeded["1K"])
                    rows.append(row)
                    log(json.dumps(row))
            for name in [g for g in order if g in grpc_servers and wanted("find_missing")]:
                before = loadavg()
                latencies = []
                for _ in range(a.find_calls):
                    t0 = time.perf_counter()
                    missing = clients[name][0].find_missing(digests)
                    latencies.append(time.perf_counter() - t0)
                    if missing != len(absent):
                        raise RuntimeError(f"{name}: {missing} missing, expected {len(absent)}")
                row = {
                    "repeat": rep,
                    "server": name,
                    "case": f"find_missing {a.find_digests}",
                    "ops": a.find_calls,
                    "p50_ms": round(statistics.median(latencies) * 1000, 1),
                    "load_before": before,
                    "load_after": loadavg(),
                }
                rows.append(row)
                log(json.dumps(row))
        run["load_end"] = loadavg()
        run["rows"] = rows
        run["summary"] = summarise(rows)
    finally:
        for group in clients.values():
            for client in group:
                client.close()
        for proc in procs:
            stop(proc, timeout=30, group=True)
        shutil.rmtree(work, ignore_errors=True)
    text = json.dumps(run, indent=1)
    print(text)
    if a.json_out:
        a.json_out.write_text(text + "\n")


def batch_case(
    a: argparse.Namespace,
    client: Client,
    op: str,
    rep: int,
    name: str,
    seeded: list[tuple[str, int]],
) -> dict[str, Any]:
    """``--batch-calls`` BatchUpdateBlobs (never-seen blobs) or BatchReadBlobs (the seeded
    1 KiB set, cycled) calls of ``--batch-blobs`` 1 KiB blobs each; the median ms per call."""
    assert isinstance(client, GrpcClient)
    n = a.batch_blobs
    if op == "batch_update":
        calls: list[Any] = [
            [blob(KiB, f"b-{name}-{rep}-{c}-{i}".encode()) for i in range(n)]
            for c in range(a.batch_calls)
        ]
        fn: Callable[[Any], None] = client.batch_update
    else:
        calls = [
            [seeded[(c * n + i) % len(seeded)] for i in range(n)] for c in range(a.batch_calls)
        ]
        fn = client.batch_read
    settle_disk()
    before = loadavg()
    latencies = []
    for call in calls:
        t0 = time.perf_counter()
        fn(call)
        latencies.append(time.perf_counter() - t0)
    return {
        "repeat": rep,
        "server": name,
        "case": f"{op} {n}x1K",
        "ops": len(calls),
        "p50_ms": round(statistics.median(latencies) * 1000, 2),
        "load_before": before,
        "load_after": loadavg(),
    }


def kura_rev() -> str:
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        here = Path(__file__).resolve().parent
        rev = subprocess.run(
            ["git", "describe", "--always", "--dirty"],
            cwd=here,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        return rev
    return "?"


def ratio(kura: dict[str, Any], other: dict[str, Any]) -> float:
    if "p50_ms" in kura:
        return float(other["p50_ms"]) / float(kura["p50_ms"])
    return float(kura["mib_s"]) / float(other["mib_s"])


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per case: each server's median MiB/s, req/s (or p50 ms), and the ratios of kura's gRPC
    to kura's HTTP and to BuildGrid (and, with ``--eatmydata``, of the unsynced kura to
    BuildGrid), taken per repeat (same repeat, side by side), their median
    and every repeat's; > 1 = kura's gRPC faster (for the cases timed per call, find_missing
    and the batches: the other's latency over kura's)."""
    out: dict[str, Any] = {}
    for case in dict.fromkeys(r["case"] for r in rows):
        mine = [r for r in rows if r["case"] == case]
        entry: dict[str, Any] = {}
        for server in dict.fromkeys(r["server"] for r in mine):
            of = [r for r in mine if r["server"] == server]
            if "p50_ms" in of[0]:
                entry[server] = {"p50_ms": statistics.median(r["p50_ms"] for r in of)}
            else:
                entry[server] = {
                    "mib_s": statistics.median(r["mib_s"] for r in of),
                    "req_s": statistics.median(r["req_s"] for r in of),
                    "repeats_mib_s": [r["mib_s"] for r in of],
                }
        by_repeat = {(r["repeat"], r["server"]): r for r in mine}
        pairs = [
            ("kura_grpc", "kura_http"),
            ("kura_grpc", "buildgrid"),
            ("kura_grpc_nosync", "buildgrid"),
        ]
        for kura, other in pairs:
            ratios = [
                ratio(by_repeat[rep, kura], r)
                for (rep, server), r in by_repeat.items()
                if server == other and (rep, kura) in by_repeat
            ]
            if ratios:
                entry[f"{kura}_over_{other}"] = {
                    "median": round(statistics.median(ratios), 2),
                    "repeats": [round(x, 2) for x in ratios],
                }
        out[case] = entry
    return out


if __name__ == "__main__":
    main()
