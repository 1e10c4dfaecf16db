#!/usr/bin/env python3
"""cachebench: load-test one HTTP blob cache with wrk.

Given a base URL and a URL layout containing "{key}", it
  * seeds N content-addressed blobs of size S with PUT (key = sha256(body)),
  * runs a wrk GET load over those keys (random key per request),
  * runs a wrk PUT load of fresh content-addressed blobs (never-seen keys),
  * optionally times one big upload and download with curl and samples the
    server's peak RSS during each,
and prints one JSON line per case on stdout.

Example:
  python3 cachebench.py --base-url http://127.0.0.1:8080 --layout '/cache/{key}' \
      --label nginx --get-sizes 1K,1M --put-sizes 1K --duration 10

  # turborepo-remote-cache style
  python3 cachebench.py --base-url http://127.0.0.1:3000 \
      --layout '/v8/artifacts/{key}?teamId=bench' -H 'Authorization: Bearer TOKEN'

Only the standard library plus the `wrk` and `curl` executables are needed.
It can also be imported (peers.py does).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import http.client
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
LUA_GET = os.path.join(HERE, "lua", "get.lua")
LUA_PUT = os.path.join(HERE, "lua", "put.lua")
LUA_PUT_ONE = os.path.join(HERE, "lua", "put_one.lua")

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
SUFFIX_LEN = 16  # every body = prefix(size-16) + "%016x" % index


# ----------------------------------------------------------------- helpers


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)i?B?\s*", text, re.I)
    if not m:
        raise ValueError(f"bad size: {text!r}")
    return int(m.group(1)) * {"": 1, "K": KiB, "M": MiB, "G": GiB}[m.group(2).upper()]


def fmt_size(n: int) -> str:
    for unit, mult in (("G", GiB), ("M", MiB), ("K", KiB)):
        if n >= mult and n % mult == 0:
            return f"{n // mult}{unit}"
    return str(n)


def parse_size_map(text: str | None) -> dict[int, int]:
    """'1M=8,64M=2' -> {1048576: 8, 67108864: 2}"""
    out: dict[int, int] = {}
    for part in filter(None, (text or "").split(",")):
        k, v = part.split("=")
        out[parse_size(k)] = int(v)
    return out


def default_conns(size: int) -> int:
    if size <= 64 * KiB:
        return 32
    if size <= MiB:
        return 8
    return 2


def default_seed_count(size: int) -> int:
    # working set <= 512 MiB so it stays in the page cache: this measures the hot path
    return max(4, min(1000, (512 * MiB) // size))


def default_put_pool(size: int) -> int:
    # distinct keys prepared for one PUT run (wrk wraps around and reports it if exhausted)
    return max(1000, min(400_000, (16 * GiB) // size))


def loadavg() -> list[float]:
    """The 1, 5 and 15 minute load averages (what `uptime` prints)."""
    try:
        with open("/proc/loadavg") as f:
            return [float(x) for x in f.read().split()[:3]]
    except OSError:
        return [float("nan")] * 3


def log(*a) -> None:
    print(*a, file=sys.stderr, flush=True)


# ----------------------------------------------------------------- target


class Target:
    """A server under test: base URL + layout ('/cache/{key}', '/v8/artifacts/{key}?teamId=x')."""

    def __init__(
        self, base_url: str, layout: str, headers: list[str] | None = None, label: str | None = None
    ):
        if "{key}" not in layout:
            raise ValueError("layout must contain {key}")
        u = urllib.parse.urlsplit(base_url)
        if u.scheme != "http":
            raise ValueError("only http:// is supported")
        self.host = u.hostname or "127.0.0.1"
        self.port = u.port or 80
        self.root = f"http://{u.netloc}"
        self.full_layout = u.path.rstrip("/") + layout
        self.headers = list(headers or [])
        self.label = label or u.netloc

    def path(self, key: str) -> str:
        return self.full_layout.replace("{key}", key)

    def url(self, key: str) -> str:
        return self.root + self.path(key)

    def split_layout(self) -> tuple[str, str]:
        before, after = self.full_layout.split("{key}", 1)
        return before, after

    def header_dict(self) -> dict[str, str]:
        out = {}
        for h in self.headers:
            name, _, value = h.partition(":")
            out[name.strip()] = value.strip()
        return out

    def connection(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=300)


# ----------------------------------------------------------------- blobs


class BlobSet:
    """Deterministic content-addressed blobs of one size.

    body(i) = prefix + b"%016x" % i, key(i) = sha256(body(i)).  The sha256 state of
    the prefix is computed once, so preparing 400k keys takes about a second.
    """

    def __init__(self, size: int, salt: str):
        if size < SUFFIX_LEN:
            raise ValueError(f"sizes must be >= {SUFFIX_LEN} bytes")
        self.size = size
        self.prefix = random.Random(f"{salt}/{size}").randbytes(size - SUFFIX_LEN)
        self._h = hashlib.sha256(self.prefix)

    def suffix(self, i: int) -> bytes:
        return b"%016x" % i

    def key(self, i: int) -> str:
        h = self._h.copy()
        h.update(self.suffix(i))
        return h.hexdigest()

    def body(self, i: int) -> bytes:
        return self.prefix + self.suffix(i)


def seed(target: Target, blobs: BlobSet, count: int) -> list[str]:
    """PUT `count` blobs (keep-alive connection); verify one GET and one HEAD."""
    hdrs = target.header_dict()
    hdrs["Content-Type"] = "application/octet-stream"
    conn = target.connection()
    keys = []
    try:
        for i in range(count):
            key = blobs.key(i)
            h = dict(hdrs, **{"Content-Length": str(blobs.size)})
            conn.request("PUT", target.path(key), body=blobs.body(i), headers=h)
            r = conn.getresponse()
            r.read()
            if not 200 <= r.status < 300:
                raise RuntimeError(f"seed PUT {target.path(key)} -> {r.status}")
            keys.append(key)
        # sanity: read back the first blob and HEAD it
        conn.request("GET", target.path(keys[0]), headers=target.header_dict())
        r = conn.getresponse()
        data = r.read()
        if r.status != 200 or data != blobs.body(0):
            raise RuntimeError(f"seed verify GET -> {r.status}, {len(data)} bytes")
        conn.request("HEAD", target.path(keys[0]), headers=target.header_dict())
        r = conn.getresponse()
        r.read()
        if r.status != 200:
            raise RuntimeError(f"seed verify HEAD -> {r.status}")
    finally:
        conn.close()
    return keys


# ----------------------------------------------------------------- wrk


def _run_wrk(
    target: Target, lua: str, lua_args: list[str], threads: int, conns: int, duration: float
) -> dict:
    wrk = shutil.which("wrk")
    if not wrk:
        raise RuntimeError("wrk not found (apt-get install wrk)")
    cmd = [
        wrk,
        "-t",
        str(threads),
        "-c",
        str(max(conns, threads)),
        "-d",
        f"{int(duration)}s",
        "--timeout",
        "60s",
        "-s",
        lua,
    ]
    for h in target.headers:
        cmd += ["-H", h]
    cmd += [target.root + "/", "--", *lua_args]
    load_before = loadavg()
    # wrk stops issuing requests after `duration`; the timeout only guards against a hang.
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 180)
    for line in p.stdout.splitlines():
        if line.startswith("WRKJSON "):
            raw = json.loads(line[len("WRKJSON ") :])
            raw["load_before"], raw["load_after"] = load_before, loadavg()
            return raw
    raise RuntimeError(f"wrk failed (rc={p.returncode}): {p.stderr.strip() or p.stdout[-2000:]}")


def _result(target: Target, op: str, size: int, threads: int, conns: int, raw: dict) -> dict:
    dur = raw["duration_us"] / 1e6 if raw["duration_us"] else float("nan")
    n = raw["requests"]
    errors = sum(
        raw[k] for k in ("err_connect", "err_read", "err_write", "err_timeout", "err_status")
    )
    ok = n > 0 and errors == 0
    if op == "GET" and n and raw["bytes"] < n * size:
        ok = False  # responses shorter than the blob: not real hits
    return {
        "label": target.label,
        "op": op,
        "size": size,
        "size_h": fmt_size(size),
        "threads": threads,
        "conns": conns,
        "duration_s": round(dur, 2),
        "requests": n,
        "rps": round(n / dur, 1) if n else 0.0,
        "MiBps": round(n * size / dur / MiB, 1) if n else 0.0,
        "p50_ms": raw["lat_p50_us"] / 1000,
        "p90_ms": raw["lat_p90_us"] / 1000,
        "p99_ms": raw["lat_p99_us"] / 1000,
        "max_ms": raw["lat_max_us"] / 1000,
        "errors": errors,
        "wrapped": raw.get("wrapped", 0),
        "ok": ok,
        "load_before": raw.get("load_before"),
        "load_after": raw.get("load_after"),
    }


def run_get(
    target: Target,
    keys: list[str],
    size: int,
    *,
    threads: int = 2,
    conns: int | None = None,
    duration: float = 10,
) -> dict:
    conns = conns or default_conns(size)
    with tempfile.NamedTemporaryFile("w", suffix=".paths", delete=False) as f:
        f.write("\n".join(target.path(k) for k in keys) + "\n")
        paths_file = f.name
    try:
        raw = _run_wrk(target, LUA_GET, [paths_file], threads, conns, duration)
    finally:
        os.unlink(paths_file)
    return _result(target, "GET", size, threads, conns, raw)


def run_put(
    target: Target,
    size: int,
    *,
    threads: int = 2,
    conns: int | None = None,
    duration: float = 10,
    pool: int | None = None,
    cleanup=None,
) -> dict:
    """PUT fresh blobs for `duration` seconds. `cleanup(keys)` is called afterwards."""
    conns = conns or default_conns(size)
    pool = pool or default_put_pool(size)
    blobs = BlobSet(size, f"put-{time.time_ns()}-{random.random()}")
    keys = [blobs.key(i) for i in range(pool)]
    tmpdir = tempfile.mkdtemp(prefix="cachebench-")
    try:
        keys_file = os.path.join(tmpdir, "keys")
        prefix_file = os.path.join(tmpdir, "prefix")
        with open(keys_file, "w") as f:
            f.write("\n".join(keys) + "\n")
        with open(prefix_file, "wb") as f:
            f.write(blobs.prefix)
        before, after = target.split_layout()
        raw = _run_wrk(
            target,
            LUA_PUT,
            [keys_file, prefix_file, str(threads), before, after],
            threads,
            conns,
            duration,
        )
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
        if cleanup:
            cleanup(keys)
    return _result(target, "PUT", size, threads, conns, raw)


def run_put_one(
    target: Target,
    size: int,
    *,
    threads: int = 2,
    conns: int | None = None,
    duration: float = 10,
) -> dict:
    """PUT one `size`-byte body to one key for `duration` seconds: for a server that reads a
    body and keeps nothing (no fresh keys needed; wrk sends one prepared request)."""
    conns = conns or default_conns(size)
    blobs = BlobSet(size, "put-one")
    with tempfile.NamedTemporaryFile("wb", suffix=".body", delete=False) as f:
        f.write(blobs.body(0))
        body_file = f.name
    try:
        raw = _run_wrk(
            target, LUA_PUT_ONE, [target.path(blobs.key(0)), body_file], threads, conns, duration
        )
    finally:
        os.unlink(body_file)
    return _result(target, "PUT", size, threads, conns, raw)


# ----------------------------------------------------------------- RSS


def tree_cpu_seconds(pid: int) -> float:
    """user + system CPU seconds of a process and its descendants so far (/proc, proc(5))."""
    total = 0.0
    for p in _children(pid):
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            pass
    return total


def _children(pid: int) -> list[int]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                kids.setdefault(ppid, []).append(int(d))
            except (OSError, IndexError, ValueError):
                pass
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def _status_kib(pid: int, field: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _pss_kib(pid: int) -> int:
    """Proportional set size: private pages plus each shared page divided by its sharers, so
    a tree's sum counts a library two processes map once (summed RSS counts it twice)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class RssWatcher:
    """Peak memory of a process tree: RSS as VmHWM after a clear_refs reset plus 20 ms sampling
    of VmRSS (summed over the tree), and PSS sampled at the same pace (the tree's real share)."""

    def __init__(self, pid: int | None):
        self.pid = pid
        self.sampled_kib = 0
        self.pss_kib = 0
        self._stop = threading.Event()
        self._t: threading.Thread | None = None
        self.hwm_reset = False

    def __enter__(self):
        if not self.pid:
            return self
        self.pids = _children(self.pid)
        self.idle_kib = sum(_status_kib(p, "VmRSS") for p in self.pids)
        self.hwm_reset = True
        for p in self.pids:
            try:
                with open(f"/proc/{p}/clear_refs", "w") as f:
                    f.write("5")
            except OSError:
                self.hwm_reset = False
        self._t = threading.Thread(target=self._sample, daemon=True)
        self._t.start()
        return self

    def _sample(self):
        while not self._stop.is_set():
            self.sampled_kib = max(
                self.sampled_kib, sum(_status_kib(p, "VmRSS") for p in self.pids)
            )
            self.pss_kib = max(self.pss_kib, sum(_pss_kib(p) for p in self.pids))
            self._stop.wait(0.02)

    def __exit__(self, *exc):
        if not self.pid:
            return False
        self._stop.set()
        self._t.join()
        self.hwm_kib = sum(_status_kib(p, "VmHWM") for p in self.pids) if self.hwm_reset else 0
        return False

    def summary(self) -> dict:
        if not self.pid:
            return {}
        peak = max(self.sampled_kib, self.hwm_kib)
        return {
            "idle_rss_mib": round(self.idle_kib / 1024, 1),
            "peak_rss_mib": round(peak / 1024, 1),
            "rss_growth_mib": round(max(0, peak - self.idle_kib) / 1024, 1),
            "peak_pss_mib": round(self.pss_kib / 1024, 1),
            "processes": len(self.pids),
        }


# ----------------------------------------------------------------- big transfer


def make_big_file(size: int, directory: str | None = None) -> tuple[str, str]:
    """Random file of `size` bytes; returns (path, sha256)."""
    fd, path = tempfile.mkstemp(prefix="cachebench-big-", dir=directory)
    h = hashlib.sha256()
    with os.fdopen(fd, "wb") as f:
        left = size
        while left:
            chunk = os.urandom(min(left, 8 * MiB))
            h.update(chunk)
            f.write(chunk)
            left -= len(chunk)
    return path, h.hexdigest()


def _curl(args: list[str]) -> tuple[int, float, int]:
    """(HTTP status, total seconds, bytes downloaded) of one curl transfer."""
    p = subprocess.run(
        [
            "curl",
            "-sS",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code} %{time_total} %{size_download}",
            "-H",
            "Expect:",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if p.returncode != 0:
        raise RuntimeError(f"curl failed: {p.stderr.strip()}")
    code, t, got = p.stdout.split()
    return int(code), float(t), int(got)


def big_upload(target: Target, path: str, key: str, size: int, rss_pid: int | None = None) -> dict:
    hargs = [x for h in target.headers for x in ("-H", h)]
    load_before = loadavg()
    with RssWatcher(rss_pid) as w:
        code, t, _ = _curl(
            [*hargs, "-H", "Content-Type: application/octet-stream", "-T", path, target.url(key)]
        )
    return {
        "label": target.label,
        "op": "PUT-big",
        "size": size,
        "size_h": fmt_size(size),
        "seconds": t,
        "MiBps": round(size / t / MiB, 1),
        "http": code,
        "ok": 200 <= code < 300,
        **w.summary(),
        "load_before": load_before,
        "load_after": loadavg(),
    }


def big_download(target: Target, key: str, size: int, rss_pid: int | None = None) -> dict:
    hargs = [x for h in target.headers for x in ("-H", h)]
    load_before = loadavg()
    with RssWatcher(rss_pid) as w:
        code, t, got = _curl([*hargs, target.url(key)])
    return {
        "label": target.label,
        "op": "GET-big",
        "size": size,
        "size_h": fmt_size(size),
        "seconds": t,
        "MiBps": round(size / t / MiB, 1),
        "http": code,
        "ok": code == 200 and got == size,
        **w.summary(),
        "load_before": load_before,
        "load_after": loadavg(),
    }


# ----------------------------------------------------------------- CLI


def median_row(rows: list[dict]) -> dict:
    """Median over repeats of one case (numeric fields), keeping the rest of the first row."""
    out = dict(rows[0])
    for k, v in rows[0].items():
        if (
            isinstance(v, (int, float))
            and not isinstance(v, bool)
            and k not in ("size", "threads", "conns", "http")
        ):
            out[k] = round(statistics.median(r[k] for r in rows), 3)
    out["ok"] = all(r.get("ok", True) for r in rows)
    out["repeats"] = len(rows)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8080")
    ap.add_argument("--layout", required=True, help="path with {key}, e.g. '/cache/{key}'")
    ap.add_argument(
        "-H", "--header", action="append", default=[], help="extra request header (repeatable)"
    )
    ap.add_argument("--label", help="name for the result lines")
    ap.add_argument("--get-sizes", default="1K,64K,1M,64M")
    ap.add_argument("--put-sizes", default="1K,1M")
    ap.add_argument(
        "--seed-count", help="per-size N, e.g. '1K=1000,64M=8' (default: <=512 MiB, <=1000)"
    )
    ap.add_argument("--conns", help="per-size connections, e.g. '1M=8' (default 32/8/2)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--duration", type=float, default=10)
    ap.add_argument("--repeat", type=int, default=1, help="repeat each case, also print the median")
    ap.add_argument(
        "--big", default="0", help="size of one curl upload+download, e.g. 1G (0 = skip)"
    )
    ap.add_argument(
        "--rss-pid", type=int, help="server pid: report peak RSS of its process tree during --big"
    )
    ap.add_argument(
        "--store-dir", help="server's blob dir: PUT-load files are deleted from it afterwards"
    )
    ap.add_argument("--store-layout", default="{key}", help="file path of a key inside --store-dir")
    a = ap.parse_args()

    t = Target(a.base_url, a.layout, a.header, a.label)
    seeds, conns = parse_size_map(a.seed_count), parse_size_map(a.conns)
    get_sizes = [parse_size(s) for s in a.get_sizes.split(",") if s.strip()]
    put_sizes = [parse_size(s) for s in a.put_sizes.split(",") if s.strip()]

    def cleanup(keys):
        if not a.store_dir:
            return
        for k in keys:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(a.store_dir, a.store_layout.replace("{key}", k)))

    def emit(row):
        print(json.dumps(row), flush=True)

    for size in get_sizes:
        n = seeds.get(size, default_seed_count(size))
        log(f"[{t.label}] seeding {n} x {fmt_size(size)}")
        keys = seed(t, BlobSet(size, "seed"), n)
        rows = []
        for _ in range(a.repeat):
            rows.append(
                run_get(
                    t, keys, size, threads=a.threads, conns=conns.get(size), duration=a.duration
                )
            )
            emit(rows[-1])
        if a.repeat > 1:
            emit(dict(median_row(rows), stat="median"))
    for size in put_sizes:
        rows = []
        for _ in range(a.repeat):
            rows.append(
                run_put(
                    t,
                    size,
                    threads=a.threads,
                    conns=conns.get(size),
                    duration=a.duration,
                    cleanup=cleanup,
                )
            )
            emit(rows[-1])
            subprocess.run(["sync"])
        if a.repeat > 1:
            emit(dict(median_row(rows), stat="median"))
    big = parse_size(a.big)
    if big:
        path, key = make_big_file(big)
        try:
            ups, downs = [], []
            for i in range(a.repeat):
                if i:
                    cleanup([key])
                ups.append(big_upload(t, path, key, big, a.rss_pid))
                emit(ups[-1])
            for _ in range(a.repeat):
                downs.append(big_download(t, key, big, a.rss_pid))
                emit(downs[-1])
            if a.repeat > 1:
                emit(dict(median_row(ups), stat="median"))
                emit(dict(median_row(downs), stat="median"))
        finally:
            os.unlink(path)
            cleanup([key])


if __name__ == "__main__":
    main()
