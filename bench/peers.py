#!/usr/bin/env python3
"""peers: start blob caches side by side, load them with cachebench, print comparison tables.

Peers (all on 127.0.0.1, each with its own store under one fresh temp dir):
  kura       this project: `kura serve`, plain HTTP cache layout /cache/{key} (see KuraPeer)
  nginx      static files + WebDAV PUT, sendfile on  (the "near-physical" HTTP reference)
  nginx1     the same with worker_processes 1 (one event loop, like the Python servers)
  turbo      turborepo-remote-cache (node, local storage), /v8/artifacts/{key}?teamId=bench
  aiohttp    servers/aiohttp_cache.py  (bare aiohttp, FileResponse -> sendfile; PUT temp+rename)
  aiohttp-hot1, aiohttp-hot2   the same, small GETs from a dict, in 1 or 2 processes (the
             ceiling of a Python server for small hits)
  kura-base, kura2-base (3, 4)   kura at another revision (--base-rev), beside kura/kuraN in
             the same run: a change against the commit it started from
  product    any other server: --product-cmd / --product-layout, see bench/README.md

Every case is repeated --repeat times; repeats are interleaved across peers (case by case)
so a noisy neighbour hits all of them alike, and the tables show medians and ratios.
Every wrk run is bounded in time (-d DURATION; a hung wrk is killed after DURATION + 180 s).
All started processes are stopped on exit (also on Ctrl-C / SIGTERM).

  .venv/bin/python bench/peers.py --peers nginx,turbo,kura --subject kura
  .venv/bin/python bench/peers.py --peers nginx,kura --quick           # smoke run
  .venv/bin/python bench/peers.py --table-from results.jsonl --subject kura
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import datetime
import grp
import hashlib
import json
import os
import platform
import pwd
import re
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any, ClassVar

from kit.wait import wait_until
from kura_harness.launch.node import spawn_kura
from kura_harness.launch.process import free_port

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cachebench as cb

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
TURBO_TOKEN = "benchtoken"
INLINE_MAX_BYTES = 16 * 1024  # kura's KURA_INLINE_MAX_BYTES default (bench uses only the stdlib)
# Where to look for turborepo-remote-cache's dist/cli.js when TURBO_CACHE_CLI is not set:
# scripts/install-deps puts the pinned version (2.12.0) into .tools/npm. Nothing is installed
# at run time.
TURBO_CLI_CANDIDATES = (
    os.path.join(REPO, ".tools", "npm", "node_modules", "turborepo-remote-cache", "dist", "cli.js"),
    os.path.join(HERE, ".peers", "node_modules", "turborepo-remote-cache", "dist", "cli.js"),
)

log = cb.log
_procs: list[Proc] = []


# ----------------------------------------------------------------- processes


class Proc:
    """A server process in its own session; stop() kills its whole process group."""

    def __init__(
        self, name: str, cmd: list[str], env: dict | None = None, logfile: str | None = None
    ):
        self.name = name
        self.log: IO[bytes] = open(logfile or os.devnull, "ab")  # noqa: SIM115 (closed in stop)
        self.p: subprocess.Popen[Any] = subprocess.Popen(
            cmd,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        _procs.append(self)

    @classmethod
    def adopt(cls, name: str, proc: subprocess.Popen[Any]) -> Proc:
        """A process a launcher started (in its own session) and that stop() ends the same."""
        self = cls.__new__(cls)
        self.name, self.p = name, proc
        self.log = open(os.devnull, "ab")  # noqa: SIM115 (closed in stop)
        _procs.append(self)
        return self

    @property
    def pid(self) -> int:
        return self.p.pid

    def stop(self) -> None:
        if self in _procs:
            _procs.remove(self)
        if self.p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.p.pid, signal.SIGTERM)
            try:
                self.p.wait(30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.p.pid, signal.SIGKILL)
                self.p.wait(5)
        self.log.close()


def stop_all() -> None:
    while _procs:
        _procs[-1].stop()


def _on_signal(signum, frame):
    raise SystemExit(128 + signum)


def wait_http(url: str, headers: dict, proc: Proc, timeout: float = 60) -> None:
    def answers() -> bool:
        try:
            urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=2)
        except urllib.error.HTTPError:
            pass  # any HTTP answer (404 for an unknown key) means it is up
        return True

    def exited() -> bool:
        return proc.p.poll() is not None

    if wait_until(answers, timeout, interval=0.2, ignoring=(OSError,), give_up=exited):
        return
    if exited():
        raise RuntimeError(f"{proc.name} exited with {proc.p.returncode}")
    raise RuntimeError(f"{proc.name} did not answer on {url}")


def _first_line(cmd: list[str], env: dict[str, str] | None = None) -> str:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=30, env=env)
    except OSError:
        return "?"
    return (p.stdout.strip() or p.stderr.strip() or "?").splitlines()[0]


# ----------------------------------------------------------------- peers


class Peer:
    name = "?"
    layout = "/cache/{key}"
    headers: ClassVar[list[str]] = []

    def __init__(self, workdir: str):
        self.dir = os.path.join(workdir, self.name)
        self.store = os.path.join(self.dir, "store")
        os.makedirs(self.store, exist_ok=True)
        self.port = free_port()
        self.proc: Proc | None = None

    @property
    def target(self) -> cb.Target:
        return cb.Target(f"http://127.0.0.1:{self.port}", self.layout, self.headers, self.name)

    def key_path(self, key: str) -> str | None:
        """The file that holds `key` in the server's store (None: unknown, never delete)."""
        return os.path.join(self.store, key)

    def cleanup(self, keys) -> None:
        """Delete the files of `keys` (PUT-load blobs) behind the server's back."""
        for k in keys:
            path = self.key_path(k)
            if path is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)

    def check_layout(self, key: str, size: int) -> None:
        """Fail early if cleanup would miss the files (the store layout guess is wrong)."""
        path = self.key_path(key)
        if path is not None and not os.path.isfile(path):
            raise RuntimeError(f"[{self.name}] stored key {key} is not at {path}: fix key_path")

    def start(self) -> None:
        raise NotImplementedError

    def ready(self) -> None:
        assert self.proc is not None
        wait_http(self.target.url("0" * 64), self.target.header_dict(), self.proc)

    def describe(self) -> str:
        return self.name


class NginxPeer(Peer):
    name = "nginx"

    def __init__(self, workdir: str, workers: str = "auto", name: str = "nginx"):
        self.name = name
        super().__init__(workdir)
        self.workers = workers

    def start(self) -> None:
        nginx = shutil.which(
            "nginx", path=os.environ.get("PATH", "") + ":/usr/sbin:/usr/local/sbin"
        )
        if not nginx:
            raise RuntimeError("nginx not found (apt-get install nginx)")
        self.version = _first_line([nginx, "-v"])
        tmp = os.path.join(self.dir, "tmp")
        for sub in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
            os.makedirs(os.path.join(tmp, sub), exist_ok=True)
        # PUT bodies are spooled to client_body_temp_path and renamed: keep it on the store's fs
        body_tmp = os.path.join(self.store, ".tmp")
        os.makedirs(body_tmp, exist_ok=True)
        user = pwd.getpwuid(os.getuid()).pw_name
        group = grp.getgrgid(os.getgid()).gr_name
        conf = f"""
user {user} {group};
worker_processes {self.workers};
pid {self.dir}/nginx.pid;
error_log {self.dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    sendfile on;
    tcp_nopush on;
    tcp_nodelay on;
    keepalive_requests 1000000;
    keepalive_timeout 300s;
    client_max_body_size 0;
    client_body_temp_path {body_tmp};
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    types {{ }}
    default_type application/octet-stream;
    server {{
        listen 127.0.0.1:{self.port};
        location /cache/ {{
            alias {self.store}/;
            dav_methods PUT DELETE;
            create_full_put_path on;
            dav_access user:rw group:r all:r;
        }}
    }}
}}
"""
        conf_path = os.path.join(self.dir, "nginx.conf")
        with open(conf_path, "w") as f:
            f.write(conf)
        self.proc = Proc(
            self.name,
            [
                nginx,
                "-p",
                self.dir,
                "-c",
                conf_path,
                "-e",
                os.path.join(self.dir, "error.log"),
                "-g",
                "daemon off;",
            ],
            logfile=os.path.join(self.dir, "stdout.log"),
        )

    def describe(self) -> str:
        return (
            f"{self.version}, worker_processes {self.workers}, sendfile on, WebDAV PUT (no fsync)"
        )


class TurboPeer(Peer):
    name = "turbo"
    layout = "/v8/artifacts/{key}?teamId=bench"
    headers: ClassVar[list[str]] = [f"Authorization: Bearer {TURBO_TOKEN}"]

    def __init__(self, workdir: str, cli: str | None = None):
        super().__init__(workdir)
        self.cli_path = cli

    def key_path(self, key: str) -> str | None:
        return os.path.join(self.store, "bench", key)

    def cli(self) -> str:
        for cand in (self.cli_path, os.environ.get("TURBO_CACHE_CLI"), *TURBO_CLI_CANDIDATES):
            if cand and os.path.isfile(cand):
                return cand
        raise RuntimeError(
            "turborepo-remote-cache not found: run scripts/install-deps (installs 2.12.0 into "
            ".tools/npm) or set TURBO_CACHE_CLI=/path/to/turborepo-remote-cache/dist/cli.js"
        )

    def start(self) -> None:
        cli = self.cli()
        node = shutil.which("node")
        if not node:
            raise RuntimeError("node not found")
        pkg = os.path.join(os.path.dirname(os.path.dirname(cli)), "package.json")
        try:
            with open(pkg) as f:
                self.version = json.load(f)["version"]
        except OSError:
            self.version = "?"
        self.node_version = _first_line([node, "--version"])
        env = dict(
            os.environ,
            NODE_ENV="production",
            HOST="127.0.0.1",
            PORT=str(self.port),
            STORAGE_PROVIDER="local",
            STORAGE_PATH=self.store,
            STORAGE_PATH_USE_TMP_FOLDER="false",
            TURBO_TOKEN=TURBO_TOKEN,
            LOG_LEVEL="warn",
            BODY_LIMIT=str(2 * cb.GiB),
        )
        self.proc = Proc(
            self.name, [node, cli], env=env, logfile=os.path.join(self.dir, "stdout.log")
        )

    def describe(self) -> str:
        return (
            f"turborepo-remote-cache {self.version} on node {self.node_version}, local storage, "
            "LOG_LEVEL=warn (no fsync)"
        )


class AiohttpPeer(Peer):
    """``aiohttp``: bare aiohttp, FileResponse per GET. ``aiohttp-hotN``: the same with small
    GETs from a dict (``--hot``) in N processes, the least Python can do per small hit."""

    def __init__(self, workdir: str, processes: int = 1, hot: bool = False) -> None:
        self.name = f"aiohttp-hot{processes}" if hot else "aiohttp"
        self.processes, self.hot = processes, hot
        super().__init__(workdir)

    def start(self) -> None:
        cmd = [sys.executable, os.path.join(HERE, "servers", "aiohttp_cache.py")]
        cmd += ["--port", str(self.port), "--root", self.store]
        cmd += ["--processes", str(self.processes)] + (["--hot"] if self.hot else [])
        self.proc = Proc(self.name, cmd, logfile=os.path.join(self.dir, "stdout.log"))

    def describe(self) -> str:
        import aiohttp

        how = "small GETs from a dict (no checks)" if self.hot else "FileResponse (sendfile)"
        return f"aiohttp {aiohttp.__version__}, {self.processes} process(es), {how}, no fsync"


def kura_artifact_id(key: str, tenant: str = "default", producer: str = "http") -> str:
    """kura's artifact identity for a plain-HTTP-cache key (src/kura/core/keys.py)."""
    h = hashlib.sha256()
    for part in (producer, tenant, ""):  # producer, tenant, namespace ("" for /cache)
        h.update(part.encode())
        h.update(b"\x00")
    h.update(key.encode())
    return h.hexdigest()


class KuraPeer(Peer):
    """`kura serve` with its data and tmp dirs under this peer's store.

    kura keeps blobs at data/blobs/ab/cd/<artifact_id>[.<version>] plus one SQLite row per key. With
    cleanup="files" (default) PUT-load blobs are deleted like the other peers' files, at the
    path computed from kura's artifact-id rule; their index rows stay (used-bytes accounting
    over-counts them, hence the large KURA_MAX_DISK_BYTES; nothing reads those keys again). With
    cleanup="keep" nothing is deleted and the 1 GiB re-uploads replace an existing entry.
    """

    name = "kura"

    def __init__(
        self,
        workdir: str,
        *,
        cmd: Sequence[str] | None = None,
        env: dict[str, str] | None = None,
        cleanup: str = "files",
        rev: str | None = None,
        name: str | None = None,
    ):
        if name:
            self.name = name  # before Peer.__init__, which names the peer's directory
        super().__init__(workdir)
        self.data_dir = os.path.join(self.store, "data")
        self.tmp_dir = os.path.join(self.store, "tmp")
        self.cmd = list(cmd) if cmd else default_kura_cmd()
        self.rev = rev
        self.source = "working tree (installed in .venv)" if not cmd else "--kura-cmd"
        self.extra_env: dict[str, str] = {}
        if rev:
            # Run the committed sources of `rev`, not the working tree others may be editing.
            commit = subprocess.run(
                ["git", "-C", REPO, "rev-parse", "--verify", rev + "^{commit}"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
            src = os.path.join(self.dir, "src-" + commit[:12])
            os.makedirs(src, exist_ok=True)
            archive = subprocess.run(
                ["git", "-C", REPO, "archive", commit, "src"], capture_output=True, check=True
            ).stdout
            subprocess.run(["tar", "-x", "-C", src], input=archive, check=True)
            # The REAPI stubs are generated (setup.py), never committed: the working tree's.
            protos = os.path.join(src, "src", "kura", "protos")
            if not os.path.exists(protos):
                shutil.copytree(os.path.join(REPO, "src", "kura", "protos"), protos)
            self.extra_env["PYTHONPATH"] = os.path.join(src, "src")
            if not cmd:
                self.cmd = [default_python(), "-m", "kura.cli"]
            self.source = f"git {rev} = {commit[:12]} (git archive, PYTHONPATH)"
        self.settings = {
            "KURA_HOST": "127.0.0.1",
            "KURA_PORT": str(self.port),
            "KURA_DATA_DIR": self.data_dir,
            "KURA_TMP_DIR": self.tmp_dir,
            "KURA_MAX_DISK_BYTES": "1TiB",
            "KURA_TMP_DIR_MAX_BYTES": "4GiB",
            "KURA_MIN_FREE_DISK_BYTES": "0",
            "KURA_HTTP_CACHE_PREFIX": "/cache",
            "KURA_LOG_LEVEL": "WARNING",
            "KURA_ACCESS_LOG": "false",
            "KURA_WORKERS": "1",  # kura: one process; kuraN sets N (the default is auto)
            **(env or {}),
        }
        self.cleanup_mode = cleanup

    def check_layout(self, key: str, size: int) -> None:
        """A body of at most ``KURA_INLINE_MAX_BYTES`` lives in its index row: no file."""
        if size > int(self.settings.get("KURA_INLINE_MAX_BYTES", INLINE_MAX_BYTES)):
            super().check_layout(key, size)

    def key_path(self, key: str) -> str | None:
        if self.cleanup_mode != "files":
            return None
        tenant = self.settings.get("KURA_TENANT_ID", "default")
        aid = kura_artifact_id(key, tenant)
        bucket = os.path.join(self.data_dir, "blobs", aid[:2], aid[2:4])
        # Layout 2 names each version <artifact_id>.<version_ms>-<sha256[:16]>; layout 1 (kura
        # before issue 10) used <artifact_id> alone. Either way one file per stored key.
        with contextlib.suppress(FileNotFoundError):
            for name in os.listdir(bucket):
                if name.startswith(aid + ".") and ".incoming-" not in name:
                    return os.path.join(bucket, name)
        return os.path.join(bucket, aid)

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("KURA_")}
        env.update(self.extra_env)
        self.version = _first_line([*self.cmd, "--version"], env)
        env.update(self.settings)
        node = spawn_kura(
            env,
            Path(self.dir) / "stdout.log",
            command=self.cmd,
            start_new_session=True,
        )
        self.proc = Proc.adopt(self.name, node.proc)

    def describe(self) -> str:
        shown = {
            k: v
            for k, v in self.settings.items()
            if k not in ("KURA_HOST", "KURA_PORT", "KURA_DATA_DIR", "KURA_TMP_DIR")
        }
        settings = " ".join(f"{k}={v}" for k, v in shown.items())
        return (
            f"{self.version} from {self.source}, "
            f"KURA_WORKERS={self.settings.get('KURA_WORKERS', '1')} process(es), "
            f"KURA_EVENT_LOOP={self.settings.get('KURA_EVENT_LOOP', 'default')}, fsync per PUT "
            f"(file + dir), cleanup={self.cleanup_mode}; {settings}"
        )


class KuraWorkersPeer(KuraPeer):
    """``kuraN`` (N = 2, 3, 4): the same kura with ``KURA_WORKERS=N`` (a primary and N - 1
    worker processes on the public port, kura.workers), to compare against ``kura`` (one
    process) in the same run."""

    def __init__(self, workdir: str, workers: int, **kwargs: Any) -> None:
        self.name = kwargs.pop("name", None) or f"kura{workers}"
        kwargs["name"] = self.name
        env = {"KURA_WORKERS": str(workers), **(kwargs.pop("env", None) or {})}
        super().__init__(workdir, env=env, **kwargs)

    def ready(self) -> None:
        super().ready()
        want = int(self.settings["KURA_WORKERS"]) - 1

        def listening() -> bool:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics") as r:
                return f"kura_workers {float(want)}" in r.read().decode()

        if wait_until(listening, 60, interval=0.1):  # workers start in the background
            return
        raise RuntimeError(f"{self.name}: {want} worker(s) not listening after 60 s")


def default_kura_cmd() -> list[str]:
    venv_kura = os.path.join(REPO, ".venv", "bin", "kura")
    if os.path.exists(venv_kura):
        return [venv_kura]
    return [sys.executable, "-m", "kura.cli"]


def default_python() -> str:
    venv_python = os.path.join(REPO, ".venv", "bin", "python")
    return venv_python if os.path.exists(venv_python) else sys.executable


class ProductPeer(Peer):
    """Any server under test: --product-cmd is run with {port} and {store} substituted."""

    name = "product"

    def __init__(
        self,
        workdir: str,
        cmd: str,
        layout: str,
        headers: list[str],
        store_layout: str,
        env: dict[str, str],
    ):
        super().__init__(workdir)
        self.cmd, self.layout, self.store_layout = cmd, layout, store_layout
        self.headers = headers
        self.env = env

    def key_path(self, key: str) -> str | None:
        if not self.store_layout:
            return None
        return os.path.join(self.store, self.store_layout.replace("{key}", key))

    def start(self) -> None:
        cmd = self.cmd.replace("{port}", str(self.port)).replace("{store}", self.store)
        self.proc = Proc(
            self.name,
            shlex.split(cmd),
            env=dict(os.environ, **self.env),
            logfile=os.path.join(self.dir, "stdout.log"),
        )

    def describe(self) -> str:
        return f"command: {self.cmd}"


# ----------------------------------------------------------------- raw baselines


def disk_write_mbps(directory: str) -> float:
    """dd 1 GiB with conv=fsync; MB/s as dd reports it (10^6)."""
    path = os.path.join(directory, "dd.bin")
    p = subprocess.run(
        ["dd", "if=/dev/zero", f"of={path}", "bs=1M", "count=1024", "conv=fsync"],
        capture_output=True,
        text=True,
    )
    os.unlink(path)
    m = re.search(r"copied, ([\d.]+) s", p.stderr)
    if m is None:
        raise RuntimeError(f"dd failed: {p.stderr.strip()}")
    return round(1073741824 / float(m.group(1)) / 1e6, 1)


def loopback_gbps() -> tuple[float, str]:
    """Single-stream loopback TCP GB/s (iperf3 if present, else a Python socket pair)."""
    iperf = shutil.which("iperf3")
    if iperf:
        port = free_port()
        srv = Proc("iperf3", [iperf, "-s", "-1", "-p", str(port)])
        time.sleep(0.5)
        try:
            p = subprocess.run(
                [iperf, "-c", "127.0.0.1", "-p", str(port), "-t", "5", "-J"],
                capture_output=True,
                text=True,
                timeout=60,
            )
            bps = json.loads(p.stdout)["end"]["sum_received"]["bits_per_second"]
            return round(bps / 8e9, 2), "iperf3 -t 5, 1 stream"
        finally:
            srv.stop()
    import threading

    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(1)
    total = [0]

    def sink():
        c, _ = ls.accept()
        while True:
            b = c.recv(1 << 20)
            if not b:
                break
            total[0] += len(b)
        c.close()

    th = threading.Thread(target=sink)
    th.start()
    s = socket.create_connection(ls.getsockname())
    buf = b"\0" * (1 << 20)
    t0 = time.time()
    while time.time() - t0 < 5:
        s.sendall(buf)
    s.close()
    th.join()
    ls.close()
    return round(total[0] / (time.time() - t0) / 1e9, 2), "python socket pair, 5 s"


def machine_info() -> dict:
    cpu = "?"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem_kib = 0
    with contextlib.suppress(OSError), open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    return {
        "cpus": os.cpu_count(),
        "cpu_model": cpu,
        "mem_gib": round(mem_kib / 1024 / 1024, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
    }


# ----------------------------------------------------------------- tables


def med(rows, key):
    vals = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(vals) if vals else float("nan")


def ratio(v, ref):
    return f"{v / ref:.2f}" if ref and ref == ref and v == v else "-"


def _fmt_load(load) -> str:
    return " / ".join(f"{x:.2f}" for x in load) if load else "?"


def _cases(results: list[dict]) -> list[tuple[str, int, int]]:
    cases: list[tuple[str, int, int]] = []
    for r in results:
        if r.get("op") in ("GET", "PUT"):
            c = (r["op"], r["size"], r.get("conns"))
            if c not in cases:
                cases.append(c)
    return cases


def _rows(results: list[dict], op: str, size: int, label: str) -> list[dict]:
    return [r for r in results if (r.get("op"), r.get("size"), r.get("label")) == (op, size, label)]


def _flag(rows: list[dict]) -> str:
    return "" if all(r.get("ok") for r in rows) else " (!errors)"


def build_tables(
    results: list[dict],
    peers: list[str],
    ref: str,
    raw: dict,
    described: dict,
    subject: str | None = None,
) -> str:
    meta = next((r for r in results if r.get("op") == "meta"), None)
    loads = {r["when"]: r["loadavg"] for r in results if r.get("op") == "load"}
    results = [r for r in results if "size" in r and "label" in r]
    out = []
    if meta:
        out.append(
            f"Run: {meta.get('date')}; {meta.get('cpus')} CPUs ({meta.get('cpu_model')}), "
            f"{meta.get('mem_gib')} GiB RAM, Linux {meta.get('kernel')}; "
            f"repeat {meta.get('repeat')}, {meta.get('duration')} s per wrk case, "
            f"{meta.get('threads')} wrk threads"
        )
        out.append(f"Command: `{meta.get('command')}`")
    if loads:
        out.append(
            "Load averages (1/5/15 min): "
            + "; ".join(f"{when} {_fmt_load(v)}" for when, v in loads.items())
        )
    out.append("")
    out.append("Peers:")
    for p in peers:
        out.append(f"- {p}: {described.get(p, '')}")
    if raw:
        out.append("")
        out.append(
            f"Raw: disk write (dd 1 GiB conv=fsync) median {raw.get('disk_MBps')} MB/s; "
            f"loopback TCP median {raw.get('loopback_GBps')} GB/s ({raw.get('loopback_how')})"
        )
    cases = _cases(results)
    others = [p for p in peers if p != subject] if subject in peers else []
    if cases and others:
        out.append("")
        out.append(
            f"Ratios {subject} / peer: **ratio of the median req/s** (ratio within each repeat, "
            f"in run order); > 1 means {subject} is faster."
        )
        out.append("")
        out.append("| case | conns | " + " | ".join(f"{subject} / {p}" for p in others) + " |")
        out.append("|" + "---|" * (2 + len(others)))
        for op, size, conns in cases:
            subj_rows = _rows(results, op, size, subject)
            subj = med(subj_rows, "rps")
            cells = []
            for p in others:
                rows = _rows(results, op, size, p)
                if not rows:
                    cells.append("-")
                    continue
                # the same repeat of two peers ran back to back: their ratio sees the same load
                by_rep = {r.get("rep"): r["rps"] for r in rows}
                per_rep = [
                    ratio(r["rps"], by_rep[r.get("rep")])
                    for r in subj_rows
                    if r.get("rep") in by_rep
                ]
                cells.append(f"**{ratio(subj, med(rows, 'rps'))}** ({', '.join(per_rep)})")
            out.append(f"| {op} {cb.fmt_size(size)} | {conns} | " + " | ".join(cells) + " |")
    if cases:
        out.append("")
        head = (
            "| case | conns | "
            + " | ".join(f"{p} req/s (MiB/s)" + ("" if p == ref else f" x{ref}") for p in peers)
            + " |"
        )
        out.append(head)
        out.append("|" + "---|" * (2 + len(peers)))
        for op, size, conns in cases:
            cells = []
            ref_rps = med(_rows(results, op, size, ref), "rps")
            for p in peers:
                rows = _rows(results, op, size, p)
                if not rows:
                    cells.append("-")
                    continue
                rps, mibps = med(rows, "rps"), med(rows, "MiBps")
                rat = "" if p == ref else f" x{ratio(rps, ref_rps)}"
                cells.append(f"{rps:,.0f} ({mibps:,.0f}){rat}{_flag(rows)}")
            out.append(f"| {op} {cb.fmt_size(size)} | {conns} | " + " | ".join(cells) + " |")
        out.append("")
        out.append(
            "| case | "
            + " | ".join(f"{p} runs req/s" for p in peers)
            + " | load 1-min before first / after last |"
        )
        out.append("|" + "---|" * (2 + len(peers)))
        for op, size, _conns in cases:
            cells = []
            loads_seen: list[float] = []
            for p in peers:
                rows = _rows(results, op, size, p)
                cells.append(", ".join(f"{r['rps']:,.0f}" for r in rows) if rows else "-")
                for r in rows:
                    if r.get("load_before"):
                        loads_seen.append(r["load_before"][0])
                    if r.get("load_after"):
                        loads_seen.append(r["load_after"][0])
            lo = f"{loads_seen[0]:.2f} / {loads_seen[-1]:.2f}" if loads_seen else "-"
            out.append(f"| {op} {cb.fmt_size(size)} | " + " | ".join(cells) + f" | {lo} |")
        out.append("")
        out.append("| case | " + " | ".join(f"{p} p50 / p99 ms" for p in peers) + " |")
        out.append("|" + "---|" * (1 + len(peers)))
        for op, size, _conns in cases:
            cells = []
            for p in peers:
                rows = _rows(results, op, size, p)
                cells.append(
                    f"{med(rows, 'p50_ms'):.2f} / {med(rows, 'p99_ms'):.2f}" if rows else "-"
                )
            out.append(f"| {op} {cb.fmt_size(size)} | " + " | ".join(cells) + " |")
    bigs = [r for r in results if r.get("op") in ("PUT-big", "GET-big")]
    if bigs:
        out.append("")
        out.append(
            "| big transfer | "
            + " | ".join(f"{p} s (MiB/s) [peak RSS MiB, +growth; PSS MiB]" for p in peers)
            + " |"
        )
        out.append("|" + "---|" * (1 + len(peers)))
        for op in ("PUT-big", "GET-big"):
            cells = []
            ref_s = med([r for r in bigs if r["op"] == op and r["label"] == ref], "seconds")
            size = next((r["size"] for r in bigs if r["op"] == op), 0)
            for p in peers:
                rows = [r for r in bigs if r["op"] == op and r["label"] == p]
                if not rows:
                    cells.append("-")
                    continue
                s = med(rows, "seconds")
                rat = "" if p == ref else f" x{ratio(ref_s, s)}"
                bad = "" if all(r["ok"] for r in rows) else " (!failed)"
                growth = med(rows, "rss_growth_mib")
                grow = f", +{growth:,.0f}" if growth == growth else ""
                peak = max(r.get("peak_rss_mib", float("nan")) for r in rows)
                pss = max(r.get("peak_pss_mib", float("nan")) for r in rows)
                pss_cell = f"; {pss:,.0f}" if pss == pss else ""
                cells.append(
                    f"{s:.2f} ({med(rows, 'MiBps'):,.0f}){rat} [{peak:,.0f}{grow}{pss_cell}]{bad}"
                )
            out.append(f"| {op} {cb.fmt_size(size)} | " + " | ".join(cells) + " |")
        if others:
            out.append("")
            out.append(
                "| big transfer | " + " | ".join(f"{subject} / {p} (MiB/s)" for p in others) + " |"
            )
            out.append("|" + "---|" * (1 + len(others)))
            for op in ("PUT-big", "GET-big"):
                size = next((r["size"] for r in bigs if r["op"] == op), 0)
                subj_s = med(
                    [r for r in bigs if r["op"] == op and r["label"] == subject], "seconds"
                )
                cells = []
                for p in others:
                    s_p = med([r for r in bigs if r["op"] == op and r["label"] == p], "seconds")
                    cells.append(ratio(s_p, subj_s))
                out.append(f"| {op} {cb.fmt_size(size)} | " + " | ".join(cells) + " |")
        out.append("")
        out.append(
            f"xN = throughput relative to {ref} (higher is better). Seconds and MiB/s are "
            "medians over repeats; peak RSS is the maximum over repeats, summed over the process "
            "tree (a library that two processes map counts twice); PSS is the tree's proportional "
            "set size (each shared page divided among the processes that map it), sampled every "
            "20 ms."
        )
    return "\n".join(out)


# ----------------------------------------------------------------- main


def _env_pairs(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep:
            raise SystemExit(f"expected KEY=VALUE, got {item!r}")
        out[k] = v
    return out


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--peers", default="nginx,turbo,kura")
    ap.add_argument("--ref", default="nginx", help="the xN columns are against this peer")
    ap.add_argument(
        "--subject", help="also print a ratio table of this peer against every other peer"
    )
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--duration", type=float, default=10, help="seconds per wrk case")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--get-sizes", default="1K,64K,1M,64M")
    ap.add_argument("--put-sizes", default="1K,1M,64M")
    ap.add_argument("--conns", help="per-size connections, e.g. '1M=8,64M=2' (default 32/8/2)")
    ap.add_argument("--big", default="1G", help="single curl upload/download size (0 = skip)")
    ap.add_argument("--nginx-workers", default="auto")
    ap.add_argument("--turbo-cli", help="turborepo-remote-cache dist/cli.js (or TURBO_CACHE_CLI)")
    ap.add_argument(
        "--kura-cmd",
        help="how to run kura (default: .venv/bin/kura); 'serve' is appended and the settings "
        "are passed as KURA_* environment variables",
    )
    ap.add_argument(
        "--kura-env",
        action="append",
        default=[],
        metavar="KURA_X=VALUE",
        help="extra or overriding kura setting (repeatable)",
    )
    ap.add_argument(
        "--kura-rev",
        metavar="REV",
        help="run kura's committed sources of this git revision (git archive into the workdir, "
        "PYTHONPATH) instead of the working tree, e.g. HEAD",
    )
    ap.add_argument(
        "--base-rev",
        metavar="REV",
        help="peers kura-base and kura2-base (3, 4): kura's committed sources of this git "
        "revision, beside kura and kuraN (the working tree or --kura-rev) in the same run, e.g. "
        "the commit an issue started from",
    )
    ap.add_argument(
        "--kura-cleanup",
        choices=("files", "keep"),
        default="files",
        help="files: delete PUT-load blob files like the other peers (default); keep: none",
    )
    ap.add_argument("--no-raw", action="store_true", help="skip the dd / loopback baselines")
    ap.add_argument("--quick", action="store_true", help="smoke run: 3 s, 1 repeat, 64M big")
    ap.add_argument("--workdir", help="default: a fresh temp dir, removed afterwards")
    ap.add_argument("--keep", action="store_true", help="keep the workdir")
    ap.add_argument("--json-out", help="append every result line (JSON) to this file")
    ap.add_argument("--md-out", help="write the final tables to this file")
    ap.add_argument(
        "--table-from", metavar="JSONL", help="only rebuild the tables from a --json-out file"
    )
    ap.add_argument(
        "--product-cmd",
        help="command with {port} and {store}, e.g. "
        "'python -m mycache --port {port} --root {store}'",
    )
    ap.add_argument("--product-layout", default="/cache/{key}")
    ap.add_argument("--product-header", action="append", default=[])
    ap.add_argument("--product-env", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument(
        "--product-store-layout",
        default="{key}",
        help="file of a key inside {store}, for deleting PUT-load files ('' = never delete)",
    )
    return ap


def _with_cpu(p: Peer, case: Any) -> dict:
    """``case()``'s row plus the CPU the peer's processes used meanwhile: ``server_cpu_s`` and
    ``server_cpu_us_per_req``, the work per request, which a busy machine disturbs far less
    than the rate (other load takes cores away; it does not add work to each request)."""
    assert p.proc is not None
    before = cb.tree_cpu_seconds(p.proc.pid)
    row = case()
    used = cb.tree_cpu_seconds(p.proc.pid) - before
    row["server_cpu_s"] = round(used, 2)
    if row.get("requests"):
        row["server_cpu_us_per_req"] = round(used * 1e6 / row["requests"], 1)
    return row


def _base_rev(a: argparse.Namespace) -> str:
    if not a.base_rev:
        raise SystemExit("the kura*-base peers need --base-rev")
    return str(a.base_rev)


def table_from(a: argparse.Namespace) -> None:
    with open(a.table_from) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    raw = next((r for r in rows if r.get("op") == "raw"), {})
    described = {r["label"]: r["describe"] for r in rows if r.get("op") == "peer"}
    order: list[str] = []
    for r in rows:
        if r.get("op") in ("GET", "PUT", "PUT-big", "GET-big") and r["label"] not in order:
            order.append(r["label"])
    table = build_tables(rows, order, a.ref, raw, described, a.subject)
    print(table)
    if a.md_out:
        with open(a.md_out, "w") as f:
            f.write(table + "\n")


def main(argv: Sequence[str] | None = None) -> None:
    a = build_parser().parse_args(argv)
    if a.table_from:
        table_from(a)
        return
    if a.quick:
        a.duration, a.repeat = min(a.duration, 3), 1
        a.big = "64M" if a.big == "1G" else a.big

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    atexit.register(stop_all)

    workdir = a.workdir or tempfile.mkdtemp(prefix="cachebench-peers-")
    names = [p.strip() for p in a.peers.split(",") if p.strip()]
    if a.product_cmd and "product" not in names:
        names.append("product")
    conns = cb.parse_size_map(a.conns)
    get_sizes = [cb.parse_size(s) for s in a.get_sizes.split(",") if s.strip()]
    put_sizes = [cb.parse_size(s) for s in a.put_sizes.split(",") if s.strip()]
    jout = open(a.json_out, "a") if a.json_out else None  # noqa: SIM115 (closed in finally)
    results: list[dict] = []

    def emit(row: dict) -> None:
        results.append(row)
        line = json.dumps(row)
        print(line, flush=True)
        if jout:
            jout.write(line + "\n")
            jout.flush()

    emit(
        {
            "label": "meta",
            "op": "meta",
            "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "command": shlex.join([os.path.relpath(sys.argv[0], REPO), *sys.argv[1:]]),
            "argv": list(argv) if argv is not None else sys.argv[1:],
            "repeat": a.repeat,
            "duration": a.duration,
            "threads": a.threads,
            "workdir": workdir,
            **machine_info(),
        }
    )
    emit({"label": "load", "op": "load", "when": "start", "loadavg": cb.loadavg()})
    raw: dict = {}
    try:
        if not a.no_raw:
            disks, loops = [], []
            how = ""
            for _ in range(a.repeat):
                disks.append(disk_write_mbps(workdir))
                g, how = loopback_gbps()
                loops.append(g)
            raw = {
                "disk_MBps": statistics.median(disks),
                "disk_runs": disks,
                "loopback_GBps": statistics.median(loops),
                "loopback_runs": loops,
                "loopback_how": how,
            }
            emit({"label": "raw", "op": "raw", **raw})

        factories = {
            "nginx": lambda: NginxPeer(workdir, a.nginx_workers),
            "nginx1": lambda: NginxPeer(workdir, "1", name="nginx1"),
            "turbo": lambda: TurboPeer(workdir, a.turbo_cli),
            "aiohttp": lambda: AiohttpPeer(workdir),
            "aiohttp-hot1": lambda: AiohttpPeer(workdir, 1, hot=True),
            "aiohttp-hot2": lambda: AiohttpPeer(workdir, 2, hot=True),
            "kura": lambda: KuraPeer(
                workdir,
                cmd=shlex.split(a.kura_cmd) if a.kura_cmd else None,
                env=_env_pairs(a.kura_env),
                cleanup=a.kura_cleanup,
                rev=a.kura_rev,
            ),
            **{
                f"kura{n}": lambda n=n: KuraWorkersPeer(
                    workdir,
                    n,
                    cmd=shlex.split(a.kura_cmd) if a.kura_cmd else None,
                    env=_env_pairs(a.kura_env),
                    cleanup=a.kura_cleanup,
                    rev=a.kura_rev,
                )
                for n in (2, 3, 4)
            },
            "kura-base": lambda: KuraPeer(
                workdir,
                cmd=shlex.split(a.kura_cmd) if a.kura_cmd else None,
                env=_env_pairs(a.kura_env),
                cleanup=a.kura_cleanup,
                rev=_base_rev(a),
                name="kura-base",
            ),
            **{
                f"kura{n}-base": lambda n=n: KuraWorkersPeer(
                    workdir,
                    n,
                    cmd=shlex.split(a.kura_cmd) if a.kura_cmd else None,
                    env=_env_pairs(a.kura_env),
                    cleanup=a.kura_cleanup,
                    rev=_base_rev(a),
                    name=f"kura{n}-base",
                )
                for n in (2, 3, 4)
            },
            "product": lambda: ProductPeer(
                workdir,
                a.product_cmd,
                a.product_layout,
                a.product_header,
                a.product_store_layout,
                _env_pairs(a.product_env),
            ),
        }
        unknown = [n for n in names if n not in factories]
        if unknown:
            raise SystemExit(f"unknown peers: {', '.join(unknown)} (known: {', '.join(factories)})")
        peers: list[Peer] = []
        for n in names:
            p = factories[n]()
            try:
                p.start()
                p.ready()
            except Exception as e:  # a missing peer should not kill the comparison
                log(f"[{n}] skipped: {e}")
                if p.proc:
                    p.proc.stop()
                continue
            peers.append(p)
            assert p.proc is not None
            log(f"[{n}] up on port {p.port} (pid {p.proc.pid})")
        described = {p.name: p.describe() for p in peers}
        for p in peers:
            assert p.proc is not None
            emit(
                {
                    "label": p.name,
                    "op": "peer",
                    "describe": described[p.name],
                    "port": p.port,
                    "pid": p.proc.pid,
                }
            )

        seeded: dict[tuple[str, int], list[str]] = {}
        for size in get_sizes:
            n = cb.default_seed_count(size)
            for p in peers:
                log(f"[{p.name}] seeding {n} x {cb.fmt_size(size)}")
                seeded[(p.name, size)] = cb.seed(p.target, cb.BlobSet(size, "seed"), n)
                p.check_layout(seeded[(p.name, size)][0], size)
        subprocess.run(["sync"])  # flush the seeded data so writeback does not hit repeat 1

        for rep in range(a.repeat):
            for size in get_sizes:
                for p in peers:
                    row = _with_cpu(
                        p,
                        lambda p=p, size=size: cb.run_get(
                            p.target,
                            seeded[(p.name, size)],
                            size,
                            threads=a.threads,
                            conns=conns.get(size),
                            duration=a.duration,
                        ),
                    )
                    emit(dict(row, rep=rep))
            for size in put_sizes:
                for p in peers:
                    row = _with_cpu(
                        p,
                        lambda p=p, size=size: cb.run_put(
                            p.target,
                            size,
                            threads=a.threads,
                            conns=conns.get(size),
                            duration=a.duration,
                            cleanup=p.cleanup,
                        ),
                    )
                    emit(dict(row, rep=rep))
                    subprocess.run(["sync"])
            log(f"repeat {rep + 1}/{a.repeat} done")

        big = cb.parse_size(a.big)
        if big:
            path, key = cb.make_big_file(big, workdir)
            try:
                for rep in range(a.repeat):
                    for p in peers:
                        assert p.proc is not None
                        p.cleanup([key])
                        subprocess.run(["sync"])
                        emit(dict(cb.big_upload(p.target, path, key, big, p.proc.pid), rep=rep))
                subprocess.run(["sync"])
                for rep in range(a.repeat):
                    for p in peers:
                        assert p.proc is not None
                        emit(dict(cb.big_download(p.target, key, big, p.proc.pid), rep=rep))
            finally:
                os.unlink(path)
                for p in peers:
                    p.cleanup([key])

        emit({"label": "load", "op": "load", "when": "end", "loadavg": cb.loadavg()})
        table = build_tables(results, [p.name for p in peers], a.ref, raw, described, a.subject)
        print("\n" + table)
        if a.md_out:
            with open(a.md_out, "w") as f:
                f.write(table + "\n")
    finally:
        stop_all()
        if jout:
            jout.close()
        if not a.workdir and not a.keep:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
