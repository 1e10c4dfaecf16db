"""A rolling reboot of a live kura mesh, coordinated by real kured agents, on one machine.

Shared by ``kura demo rolling-reboot`` and tests/e2e/test_rolling_reboot.py (``run(config)``
returns a ``RollingResult``; ``evaluate`` lists every violated invariant).

The scenario
------------
``hosts`` "machines" on 127.0.0.1, each a directory with its own kura node (own data and tmp
dirs, fixed public and internal ports picked at start so peers and gates find a restarted node)
and its own kured agent (fixed metrics port). They share one etcd (the reboot lock) and one
Prometheus that scrapes every kura and kured ``/metrics`` each second and loads
``deploy/alerts/*.rules.yml``. Every agent gates on every kura node's ``/ready`` and on "no
firing alert from the kura set" (``--alert-filter-regexp`` = the kura alert names, anchored,
with ``--alert-filter-match-only``).

kured triggers each reboot: its ``--reboot-command`` is ``reboot.sh`` in the work dir, which
appends ``<time> <host> reboot`` to ``events.log``, removes the host's sentinel and touches the
host's ``reboot-requested`` file. The host's supervisor thread sees that file and "reboots" the
host: it stops routing load to it, stops kura (SIGKILL for the hosts in ``sigkill_hosts``,
SIGTERM for the others), wipes its data and tmp dirs for the hosts in ``wipe_hosts`` (a replaced
disk; before that it drains the host like kured's cordon and drain would: no new requests, the
in-flight ones finish, its outbox empties), kills the agent, then starts kura on the same ports
and the agent again. The agent recognises the reboot it triggered, waits
``--lock-release-delay`` and releases the lock; the next agent takes it only once every gate is
open, i.e. once the restarted node has finished bootstrapping and answers ``/ready`` 200.

Throughout, an asyncio load generator writes new artifacts (plain ``/cache``, Nx ``/v1/cache``,
Turborepo ``/v8/artifacts``, key-value) to nodes that are up and reads artifacts written before
the run and acknowledged during it from nodes that are up, and the real Nx, Turborepo and ccache
drivers of ``tests/clients/`` build against a node that is up before, during and after. An
external sampler thread measures each node's tmp dir every few milliseconds. At the end every
acknowledged artifact is read from every node through the public routes and compared by SHA-256.

What counts as a failed read
----------------------------
A read is judged only if its node was up for the whole request (no reboot of that host began
or ended meanwhile); a request cut by a reboot is counted as "excused". On an up node, any
transport error, a status other than 200, or wrong bytes is a violation, with one exception: an
artifact acknowledged during the run by *another* node may not have been replicated yet, so a
404 for it is a "replication-lag miss" (counted, not a violation). Artifacts written before the
run, and reads from the node that acknowledged the write, must always succeed.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import datetime as dt
import hashlib
import http.client
import io
import itertools
import json
import math
import os
import random
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

KiB = 1024
MiB = 1024 * KiB

CLIENT_NAMES = ("nx", "turbo", "ccache")
PROTOCOLS = ("http", "nx", "turbo", "keyvalue")
PROTOCOL_WEIGHTS = (35, 25, 25, 15)
KEYVALUE_QUERY = "tenant_id=demo&namespace_id=rolling"
TURBO_QUERY = "slug=rolling"
HIT_LINE = re.compile(r"^REMOTE HIT\b", re.MULTILINE)
KURA_LISTEN = re.compile(r"kura listening public=(http://\S+) internal=(https?://\S+)")
KURED_LISTEN = re.compile(r"kured listening metrics=(http://\S+)")
ALERT_LINE = re.compile(r"^\s*-\s*alert:\s*([A-Za-z_][A-Za-z0-9_]*)\s*$", re.MULTILINE)
BOOTSTRAP_PCT = re.compile(r"bootstrap in progress: .*?(\d+)% of bytes")
LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}) \S+ \S+ (.*)$")
CLIENT_TIMEOUT_SECONDS = 180.0
START_TIMEOUT_SECONDS = 60.0

REBOOT_SCRIPT = """#!/bin/sh
# kured's --reboot-command in `kura demo rolling-reboot`: record the reboot, clear the sentinel
# (a boot clears /var/run), and ask the demo's host supervisor to power-cycle this host.
# Usage: reboot.sh HOST EVENTS_LOG SENTINEL REQUEST_FILE
echo "$(date +%s.%N) $1 reboot" >> "$2"
rm -f "$3"
touch "$4"
"""


class DemoError(Exception):
    """The demo cannot run here (a missing binary, a port that never bound, ...)."""


# --- configuration and results ---------------------------------------------------------------


@dataclass
class RollingConfig:
    """What to run. The defaults are the CI size (about 40 MB of artifacts, 16 MiB tmp)."""

    workdir: Path
    hosts: int = 3
    data_mb: float = 40.0
    tmp_budget_bytes: int = 16 * MiB
    max_artifact_bytes: int = 4 * MiB
    sigkill_hosts: tuple[int, ...] = (0,)
    wipe_hosts: tuple[int, ...] = (1, 2)
    lock_release_delay: str = "2s"
    settle_ms: int = 500
    # "auto": run the real clients when the repo's tests/clients and .tools are there, else
    # skip them with a note; "require": missing tools are an error; "off": never run them.
    clients: str = "auto"
    repo: Path | None = None
    write_rate: float = 3.0  # new artifacts per second during the rolling phase
    read_rate: float = 30.0  # reads per second during the rolling phase
    run_write_max_bytes: int = 512 * KiB
    # The demo's router sends traffic to a (re)started node once its /up answers and, unless
    # this is set, once /up also lists every host as a member. A node that has not finished
    # its first discovery round has no peers to read through to, so a miss on a wiped node
    # in those first milliseconds is a 404 (docs/rolling-reboot.md, "Findings").
    route_before_discovery: bool = False
    # Bootstrap speed: each artifact body a node serves to a bootstrapping peer is sent at no
    # more than this (KURA_REPLICATION_BANDWIDTH_LIMIT_BYTES_PER_SECOND; 0 = unthrottled), and
    # a joining node downloads this many bodies at once from each peer. The defaults make a
    # wiped node's bootstrap of the CI data outlast kured's restart plus --lock-release-delay,
    # so the run shows the /ready gate holding a free lock, not just the release delay. One
    # download per peer keeps bootstrap's reservations (at most peers x largest artifact) at
    # half the 16 MiB budget: read-through reserves fail-fast, so a budget that bootstrap
    # fills makes a joining node answer 404 (docs/rolling-reboot.md, "Findings").
    replication_limit_bytes_per_second: int = 3 * MiB
    bootstrap_downloads_per_peer: int = 1
    rolling_timeout_seconds: float = 600.0
    keep: bool = False  # keep the data dirs (logs, events and the summary are always kept)
    seed: int = 0
    extra_kura_env: dict[str, str] = field(default_factory=dict)
    progress: Callable[[str], None] | None = None
    # SIGINT/SIGTERM cancel the run (every process it started is stopped); main thread only.
    handle_signals: bool = False


@dataclass
class HostReport:
    name: str
    index: int
    stop_signal: str
    wiped: bool
    public_url: str = ""
    internal_url: str = ""
    kured_url: str = ""
    reboot_at: float | None = None  # the reboot script's event (kured ran --reboot-command)
    lock_acquired_at: float | None = None  # from the agent's log
    lock_released_at: float | None = None
    requested_at: float | None = None  # the supervisor noticed the request
    drain_seconds: float | None = None
    stopped_at: float | None = None
    kura_up_at: float | None = None  # its listen line (the public port accepts)
    routable_at: float | None = None  # the demo's router sends it traffic again
    agent_boot_at: float | None = None
    ready_at: float | None = None  # first /ready 200 after the restart (response received)
    last_not_ready_at: float | None = None
    refill_bytes: int = 0  # disk_used_bytes gained between the restart and /ready 200
    bootstrap_applied_artifacts: int = 0
    bootstrap_seconds: float | None = None
    bootstrap_mib_per_second: float | None = None
    tmp_budget_bytes: int = 0
    tmp_peak_bootstrap_bytes: int = 0  # this host's tmp peak while it bootstrapped
    tmp_peak_during_any_bootstrap: dict[str, int] = field(default_factory=dict)
    tmp_peak_run_bytes: int = 0
    tmp_reserved_peak_bytes: int = 0  # kura's own ledger (/status, every 0.1 s) while booting
    reboots: int = 0


@dataclass
class LoadReport:
    seeded_artifacts: int = 0
    seeded_bytes: int = 0
    seeded_by_protocol: dict[str, int] = field(default_factory=dict)
    run_writes_acked: int = 0
    run_written_bytes: int = 0
    write_attempts: int = 0
    writes_shed_503: int = 0  # refused with 503 (tmp budget full) even after retries
    write_errors_on_up_nodes: int = 0
    writes_excused: int = 0
    reads: int = 0
    reads_ok: int = 0
    read_failures_on_up_nodes: int = 0
    read_lag_misses: int = 0
    reads_excused: int = 0
    reads_during_reboot: int = 0
    reads_outside_reboot: int = 0
    read_p50_ms_during: float | None = None
    read_p99_ms_during: float | None = None
    read_p50_ms_outside: float | None = None
    read_p99_ms_outside: float | None = None
    # Of the reads during reboots, those served by the node that was rebooting (booting or
    # bootstrapping: misses are read through from peers).
    reads_on_joining_node: int = 0
    read_p99_ms_joining_node: float | None = None
    write_p99_ms_during: float | None = None
    write_p99_ms_outside: float | None = None
    ops_per_second: float = 0.0
    violations: list[str] = field(default_factory=list)


@dataclass
class ClientRun:
    phase: str
    client: str
    host: str
    started_at: float
    ended_at: float
    returncode: int
    hit: bool
    target_stayed_up: bool
    overlapped_reboot: bool = False
    output_tail: str = ""


@dataclass
class RollingResult:
    ok: bool = False
    violations: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    workdir: str = ""
    summary_path: str = ""
    started_at: float = 0.0
    ended_at: float = 0.0
    rolling_started_at: float = 0.0
    phases: dict[str, dict[str, float]] = field(default_factory=dict)
    hosts: list[HostReport] = field(default_factory=list)
    lock_history: list[dict[str, Any]] = field(default_factory=list)
    # One per consecutive pair of reboots: when the previous host gave the lock back, when it
    # answered /ready 200, when the next host took the lock and ran its reboot command.
    handoffs: list[dict[str, Any]] = field(default_factory=list)
    load: LoadReport = field(default_factory=LoadReport)
    artifacts_total: int = 0
    verified_reads: int = 0
    lost: list[str] = field(default_factory=list)
    clients: list[ClientRun] = field(default_factory=list)
    clients_skipped: str = ""
    prometheus: dict[str, Any] = field(default_factory=dict)
    tmp_samples: int = 0
    finished: bool = False

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=False, default=str)


# --- small helpers ----------------------------------------------------------------------------


def _http(
    url: str, timeout: float = 2.0, data: bytes | None = None, method: str | None = None
) -> tuple[int, bytes]:
    """(status, body); raises OSError when nothing answered."""
    request = urllib.request.Request(url, data=data, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return int(response.status), bytes(response.read())
    except urllib.error.HTTPError as exc:
        return int(exc.code), bytes(exc.read())
    except urllib.error.URLError as exc:
        raise OSError(str(exc.reason)) from exc


def _json(url: str, timeout: float = 5.0) -> Any:
    status, body = _http(url, timeout)
    if status != 200:
        raise OSError(f"{url} answered {status}")
    return json.loads(body)


def _ephemeral_low() -> int:
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
        return int(text.split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def pick_ports(count: int, rng: random.Random) -> list[int]:
    """``count`` distinct free ports below the ephemeral range, so that no outgoing connection
    takes one while its node is down (they are reused when a host restarts)."""
    high = min(_ephemeral_low(), 32768) - 1
    low = 20000
    held: list[socket.socket] = []
    ports: list[int] = []
    try:
        attempts = 0
        while len(ports) < count:
            attempts += 1
            if attempts > 5000:
                raise DemoError("no free ports found on 127.0.0.1")
            port = rng.randint(low, high) if high - low > 1000 else 0
            if port in ports:
                continue
            sock = socket.socket()
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                sock.close()
                continue
            held.append(sock)
            ports.append(int(sock.getsockname()[1]))
        return ports
    finally:
        for sock in held:
            sock.close()


def dir_bytes(path: Path) -> int:
    """Apparent size of every file under ``path`` (0 when it does not exist)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except FileNotFoundError:
                continue
    return total


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[rank]


def log_times(log: str, message_prefix: str) -> list[float]:
    """Unix times of every log line (kit.log format, local time) whose message starts with
    ``message_prefix``."""
    times = []
    for line in log.splitlines():
        m = LOG_LINE.match(line)
        if m and m.group(2).startswith(message_prefix):
            stamp = dt.datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S.%f")
            times.append(stamp.timestamp())
    return times


def read_events(path: Path) -> list[tuple[float, str, str]]:
    """``events.log`` as sorted (unix time, host, what)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 3:
            out.append((float(parts[0]), parts[1], parts[2]))
    return sorted(out)


def find_repo(start: Path | None = None) -> Path | None:
    """The kura checkout (it has deploy/alerts and tests/clients): ``start``, the current
    directory or the one this package was installed from (editable installs)."""
    candidates = [start] if start is not None else []
    candidates += [Path.cwd(), Path(__file__).resolve().parents[3]]
    for base in candidates:
        if base is None:
            continue
        for d in (base, *base.parents):
            if (d / "deploy" / "alerts" / "kura.rules.yml").is_file():
                return d
    return None


def kura_alert_names(rules_file: Path) -> list[str]:
    return ALERT_LINE.findall(rules_file.read_text())


def _spawn(
    argv: list[str],
    env: dict[str, str],
    log_path: Path,
    pattern: re.Pattern[str],
    what: str,
    cwd: Path | None = None,
) -> tuple[subprocess.Popen[str], re.Match[str]]:
    """Start ``argv`` and wait for the stdout line matching ``pattern``; stderr goes to
    ``log_path`` (appended). Raises DemoError when it exits or times out first."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("a") as log:
        proc = subprocess.Popen(
            argv,
            env=env,
            stdout=subprocess.PIPE,
            stderr=log,
            stdin=subprocess.DEVNULL,
            text=True,
            cwd=cwd,
        )
    found: list[re.Match[str]] = []
    done = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                if not found:
                    m = pattern.search(line)
                    if m:
                        found.append(m)
                        done.set()
        finally:
            proc.stdout.close()  # EOF: the process exited
            done.set()

    threading.Thread(target=read, daemon=True, name=f"stdout {what}").start()
    done.wait(START_TIMEOUT_SECONDS)
    if not found:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        tail = log_path.read_text(errors="replace")[-2000:]
        raise DemoError(f"{what} did not start (rc={proc.returncode}):\n{tail}")
    return proc, found[0]


def _stop(
    proc: subprocess.Popen[Any] | None, sig: int = signal.SIGTERM, timeout: float = 30
) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _which(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise DemoError(
            f"`{name}` is not on PATH: the demo runs a real {name} "
            "(Debian: apt-get install etcd-server prometheus; or run scripts/install-deps)"
        )
    return path


def _signal_name(sig: int) -> str:
    return signal.Signals(sig).name


# --- shared infrastructure: etcd and Prometheus ----------------------------------------------


class Etcd:
    def __init__(self, directory: Path, ports: list[int]) -> None:
        self.binary = _which("etcd")
        self.dir = directory
        self.ports = ports
        self.url = ""
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        client, peer = self.ports
        self.url = f"http://127.0.0.1:{client}"
        peer_url = f"http://127.0.0.1:{peer}"
        with (self.dir / "etcd.log").open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    self.binary,
                    "--name=demo",
                    f"--data-dir={self.dir / 'data'}",
                    f"--listen-client-urls={self.url}",
                    f"--advertise-client-urls={self.url}",
                    f"--listen-peer-urls={peer_url}",
                    f"--initial-advertise-peer-urls={peer_url}",
                    f"--initial-cluster=demo={peer_url}",
                    "--initial-cluster-state=new",
                    "--heartbeat-interval=50",
                    "--election-timeout=250",
                    "--log-level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while time.monotonic() < deadline and self.proc.poll() is None:
            with contextlib.suppress(OSError, ValueError):
                if _json(self.url + "/health", 1).get("health") == "true":
                    return
            time.sleep(0.1)
        _stop(self.proc)
        tail = (self.dir / "etcd.log").read_text(errors="replace")[-2000:]
        raise DemoError(f"etcd did not become healthy:\n{tail}")

    def stop(self) -> None:
        _stop(self.proc)


class Prometheus:
    def __init__(self, directory: Path, port: int, rule_files: list[Path]) -> None:
        self.binary = _which("prometheus")
        self.dir = directory
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.rule_files = rule_files
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, kura_targets: list[str], kured_targets: list[str]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)

        def targets(items: list[str]) -> str:
            return "[" + ", ".join(f"'{t}'" for t in items) + "]"

        rules = "".join(f"  - '{p}'\n" for p in self.rule_files)
        (self.dir / "prometheus.yml").write_text(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
            f"rule_files:\n{rules}"
            "scrape_configs:\n"
            f"  - job_name: kura\n    static_configs:\n      - targets: {targets(kura_targets)}\n"
            f"  - job_name: kured\n    static_configs:\n      - targets: {targets(kured_targets)}\n"
        )
        with (self.dir / "prometheus.log").open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    self.binary,
                    f"--config.file={self.dir / 'prometheus.yml'}",
                    f"--storage.tsdb.path={self.dir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while time.monotonic() < deadline and self.proc.poll() is None:
            with contextlib.suppress(OSError):
                if _http(self.url + "/-/ready", 2)[0] == 200:
                    return
            time.sleep(0.2)
        _stop(self.proc)
        tail = (self.dir / "prometheus.log").read_text(errors="replace")[-2000:]
        raise DemoError(f"prometheus did not become ready (a rule file it cannot load?):\n{tail}")

    def rules(self) -> list[dict[str, Any]]:
        data = _json(self.url + "/api/v1/rules")
        return [
            {
                "group": g["name"],
                "name": r.get("name", ""),
                "health": r.get("health", ""),
                "lastError": r.get("lastError", ""),
            }
            for g in data["data"]["groups"]
            for r in g["rules"]
        ]

    def targets(self) -> list[dict[str, Any]]:
        data = _json(self.url + "/api/v1/targets")
        return [
            {"job": t["labels"].get("job", ""), "url": t["scrapeUrl"], "health": t["health"]}
            for t in data["data"]["activeTargets"]
        ]

    def query(self, promql: str) -> list[dict[str, Any]]:
        q = urllib.parse.quote(promql)
        data = _json(f"{self.url}/api/v1/query?query={q}")
        return list(data["data"]["result"])

    def stop(self) -> None:
        _stop(self.proc)


# --- the external tmp-dir sampler -------------------------------------------------------------


class TmpSampler:
    """A thread that samples every host's tmp dir size every ``interval`` seconds; keeps the
    peak per host for the whole run and for each open window."""

    def __init__(self, dirs: dict[str, Path], interval: float = 0.005) -> None:
        self.dirs = dirs
        self.interval = interval
        self.peaks: dict[str, int] = dict.fromkeys(dirs, 0)
        self.samples = 0
        self._windows: dict[int, dict[str, int]] = {}
        self._next = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="tmp sampler")

    def start(self) -> None:
        self._thread.start()

    def _sample(self) -> None:
        sizes = {name: dir_bytes(path) for name, path in self.dirs.items()}
        with self._lock:
            self.samples += 1
            for name, size in sizes.items():
                self.peaks[name] = max(self.peaks[name], size)
                for window in self._windows.values():
                    window[name] = max(window[name], size)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval)

    def open_window(self) -> int:
        with self._lock:
            self._next += 1
            self._windows[self._next] = dict.fromkeys(self.dirs, 0)
            return self._next

    def close_window(self, key: int) -> dict[str, int]:
        self._sample()  # one sample at the very end of the window too
        with self._lock:
            return self._windows.pop(key)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)


# --- one host: a kura node, a kured agent and the supervisor that "reboots" them ---------------


class Host:
    def __init__(self, run: Rolling, index: int, ports: tuple[int, int, int]) -> None:
        cfg = run.config
        self.run = run
        self.index = index
        self.name = f"host{index}"
        self.dir = run.workdir / self.name
        self.data_dir = self.dir / "kura" / "data"
        self.tmp_dir = self.dir / "kura" / "tmp"
        self.sentinel = self.dir / "reboot-required"
        self.request = self.dir / "reboot-requested"
        self.port, self.internal_port, self.metrics_port = ports
        self.url = f"http://127.0.0.1:{self.port}"
        self.internal_url = f"http://127.0.0.1:{self.internal_port}"
        self.kured_url = f"http://127.0.0.1:{self.metrics_port}"
        self.stop_signal = signal.SIGKILL if index in cfg.sigkill_hosts else signal.SIGTERM
        self.wipe = index in cfg.wipe_hosts
        self.kura: subprocess.Popen[str] | None = None
        self.agent: subprocess.Popen[str] | None = None
        self.kura_starts = 0
        # Routing state, written by the supervisor thread and read by the load generator.
        self.up = False
        self.gen = 0
        self.inflight = 0
        self.rebooting = False
        self.bootstrap_line = ""
        self.report = HostReport(
            self.name,
            index,
            _signal_name(self.stop_signal),
            self.wipe,
            self.url,
            self.internal_url,
            self.kured_url,
            tmp_budget_bytes=cfg.tmp_budget_bytes,
        )
        self._thread = threading.Thread(target=self._supervise, daemon=True, name=self.name)
        self._ready_thread: threading.Thread | None = None

    # -- state --

    def set_up(self, up: bool) -> None:
        with self.run.lock:
            self.up = up
            self.gen += 1

    def snapshot(self) -> tuple[bool, int]:
        with self.run.lock:
            return self.up, self.gen

    # -- processes --

    def kura_env(self) -> dict[str, str]:
        cfg = self.run.config
        env = {k: v for k, v in os.environ.items() if not k.startswith("KURA_")}
        env.update(
            {
                "KURA_HOST": "127.0.0.1",
                "KURA_PORT": str(self.port),
                "KURA_INTERNAL_PORT": str(self.internal_port),
                "KURA_NODE_URL": self.internal_url,
                "KURA_PEERS": ",".join(h.internal_url for h in self.run.hosts),
                "KURA_REGION": self.name,
                "KURA_DATA_DIR": str(self.data_dir),
                "KURA_TMP_DIR": str(self.tmp_dir),
                "KURA_TMP_DIR_MAX_BYTES": str(cfg.tmp_budget_bytes),
                "KURA_MIN_FREE_DISK_BYTES": "0",
                "KURA_DISCOVERY_SETTLE_MS": str(cfg.settle_ms),
                "KURA_DISCOVERY_INTERVAL_MS": "500",
                "KURA_DISCOVERY_INITIAL_TIMEOUT_MS": "15000",
                "KURA_REPLICATION_BACKOFF_MAX_MS": "4000",
                "KURA_SHUTDOWN_TIMEOUT_SECONDS": "10",
                "KURA_READ_THROUGH": "joining",
                "KURA_READ_THROUGH_TIMEOUT_MS": str(self.run.read_through_timeout_ms()),
                "KURA_REPLICATION_BANDWIDTH_LIMIT_BYTES_PER_SECOND": str(
                    cfg.replication_limit_bytes_per_second
                ),
                "KURA_BOOTSTRAP_DOWNLOADS_PER_PEER": str(cfg.bootstrap_downloads_per_peer),
                "KURA_LOG_LEVEL": "INFO",
            }
        )
        env.update(cfg.extra_kura_env)
        return env

    def start_kura(self) -> None:
        self.kura_starts += 1
        log = self.dir / f"kura-{self.kura_starts}.log"
        last: DemoError | None = None
        for attempt in range(5):  # a port still held by a dying socket: try again shortly
            try:
                self.kura, _ = _spawn(
                    [sys.executable, "-m", "kura.cli", "serve"],
                    self.kura_env(),
                    log,
                    KURA_LISTEN,
                    f"kura on {self.name}",
                    cwd=self.dir,
                )
                return
            except DemoError as exc:
                last = exc
                time.sleep(0.5 * (attempt + 1))
        assert last is not None
        raise last

    def agent_argv(self) -> list[str]:
        run = self.run
        script = shlex.join(
            [
                str(run.reboot_script),
                self.name,
                str(run.events),
                str(self.sentinel),
                str(self.request),
            ]
        )
        argv = [
            sys.executable,
            "-m",
            "kured.cli",
            "--node-id",
            self.name,
            "--lock-backend",
            "etcd",
            "--etcd-endpoints",
            run.etcd.url,
            "--reboot-sentinel",
            str(self.sentinel),
            "--reboot-command",
            script,
            "--host-namespace",
            "false",
            "--prometheus-url",
            run.prometheus.url,
            "--alert-filter-regexp",
            run.alert_regexp,
            "--alert-filter-match-only",
            "--alert-firing-only",
            "--lock-release-delay",
            run.config.lock_release_delay,
            "--period",
            "1s",
            "--start-time",
            "00:00",
            "--end-time",
            "23:59:59",
            "--metrics-host",
            "127.0.0.1",
            "--metrics-port",
            str(self.metrics_port),
            "--state-dir",
            str(self.dir / "kured-state"),
        ]
        for h in run.hosts:
            argv += ["--gate-url", h.url + "/ready"]
        return argv

    def start_agent(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("KURED_")}
        last: DemoError | None = None
        for attempt in range(5):
            try:
                self.agent, _ = _spawn(
                    self.agent_argv(),
                    env,
                    self.dir / "kured.log",
                    KURED_LISTEN,
                    f"kured on {self.name}",
                )
                break
            except DemoError as exc:
                last = exc
                time.sleep(0.5 * (attempt + 1))
        else:
            assert last is not None
            raise last
        self.report.agent_boot_at = time.time()
        self.run.event(self.name, "boot")

    def start(self) -> None:
        """First start: kura only (``setup`` waits until every node is routable)."""
        self.start_kura()

    def wait_routable(self) -> None:
        """Until /up answers 200 (and lists every host, see ``route_before_discovery``)."""
        want = 1 if self.run.config.route_before_discovery else len(self.run.hosts)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not self.run.stopping.is_set():
            with contextlib.suppress(OSError, ValueError, KeyError):
                if int(_json(self.url + "/up", 2)["ring_members"]) >= want:
                    return
            time.sleep(0.005)
        self.run.note(f"{self.name}: /up did not list every host within 30 s; routing anyway")

    def start_supervisor(self) -> None:
        self._thread.start()

    def join(self) -> None:
        """Wait for the supervisor (after ``run.stopping`` is set) and the ready watcher."""
        if self._thread.is_alive():
            self._thread.join(90)
        if self._ready_thread is not None:
            self._ready_thread.join(10)

    def agent_log(self) -> str:
        path = self.dir / "kured.log"
        return path.read_text(errors="replace") if path.exists() else ""

    # -- the reboot --

    def _supervise(self) -> None:
        while not self.run.stopping.is_set():
            if self.request.exists():
                try:
                    self._reboot()
                except Exception as exc:  # recorded as a violation; the run goes on
                    self.run.violation(f"{self.name}: the reboot failed: {exc!r}")
                    self.rebooting = False
            self.run.stopping.wait(0.02)

    def _reboot(self) -> None:
        run, rep = self.run, self.report
        rep.reboots += 1
        self.rebooting = True
        rep.requested_at = time.time()
        self.request.unlink(missing_ok=True)
        run.event(self.name, "requested")
        self.set_up(False)  # the load generator and the clients route around it from now on
        run.say(f"{self.name}: kured asked for a reboot; taking the host down")
        if self.wipe:
            started = time.monotonic()
            self._drain()
            rep.drain_seconds = time.monotonic() - started
        if self.run.stopping.is_set():
            return
        _stop(self.kura, self.stop_signal, timeout=30)
        rep.stopped_at = time.time()
        run.event(self.name, "kura-stopped")
        if self.wipe:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            shutil.rmtree(self.tmp_dir, ignore_errors=True)
            run.event(self.name, "wiped")
        _stop(self.agent, signal.SIGKILL)
        run.event(self.name, "agent-killed")
        how = _signal_name(self.stop_signal) + (", data dir wiped" if self.wipe else "")
        run.say(f"{self.name}: kura and kured stopped ({how}); booting")
        if self.run.stopping.is_set():
            return
        self.start_kura()
        rep.kura_up_at = time.time()
        run.event(self.name, "kura-up")
        self._ready_thread = threading.Thread(
            target=self._watch_ready, daemon=True, name=f"{self.name} ready"
        )
        self._ready_thread.start()
        self.wait_routable()
        rep.routable_at = time.time()
        self.set_up(True)
        run.event(self.name, "routable")
        if not self.run.stopping.is_set():
            self.start_agent()
        self.rebooting = False

    def _drain(self) -> None:
        """Before a disk is replaced: no new requests (already routed away), let the in-flight
        ones finish, and wait until the node's outbox is empty, as kured's drain of the node
        would before the machine goes down."""
        deadline = time.monotonic() + 15
        while self.inflight > 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError):
                if _json(self.url + "/status")["outbox_messages"] == 0:
                    return
            time.sleep(0.05)
        self.run.note(f"{self.name}: outbox not empty after 30 s of draining; wiping anyway")

    def _watch_ready(self) -> None:
        """From the restart until /ready answers 200: poll it over one kept-alive connection,
        every 20 ms while bootstrap is below 90 %, every 2 ms after (so ``ready_at`` trails the
        node's own switch by a few ms); sample /status every 0.1 s for the progress line and
        kura's reserved tmp bytes; keep the tmp sampler's window open meanwhile."""
        rep, sampler = self.report, self.run.sampler
        window = sampler.open_window()
        start_used: int | None = None
        next_status = 0.0
        conn: http.client.HTTPConnection | None = None
        while not self.run.stopping.is_set():
            now = time.monotonic()
            if now >= next_status:
                next_status = now + 0.1
                with contextlib.suppress(OSError, ValueError, KeyError):
                    st = _json(self.url + "/status", 2)
                    if start_used is None:
                        start_used = int(st["disk_used_bytes"])
                    rep.tmp_reserved_peak_bytes = max(
                        rep.tmp_reserved_peak_bytes, int(st["tmp_reserved_bytes"])
                    )
                    b = st["bootstrap"]
                    total, done = int(b["bytes_total"]), int(b["bytes_done"])
                    pct = 100 * done / total if total else 100.0
                    stored = (int(st["disk_used_bytes"]) - start_used) / MiB
                    self.bootstrap_line = f"bootstrap {pct:.0f}%, {stored:.1f} MiB stored"
            status, body = 0, b""
            try:
                if conn is None:
                    conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                conn.request("GET", "/ready")
                response = conn.getresponse()
                status, body = response.status, response.read()
            except (OSError, http.client.HTTPException):
                if conn is not None:
                    conn.close()
                conn = None
            if status == 200:
                rep.ready_at = time.time()
                break
            rep.last_not_ready_at = time.time()
            m = BOOTSTRAP_PCT.search(body.decode(errors="replace"))
            time.sleep(0.02 if m is not None and int(m.group(1)) < 90 else 0.002)
        if conn is not None:
            conn.close()
        peaks = sampler.close_window(window)
        self.bootstrap_line = ""
        if rep.ready_at is None:
            return
        self.run.event(self.name, "ready")
        rep.tmp_peak_bootstrap_bytes = peaks[self.name]
        rep.tmp_peak_during_any_bootstrap = peaks
        with contextlib.suppress(OSError, ValueError, KeyError):
            st = _json(self.url + "/status", 5)
            rep.refill_bytes = max(0, int(st["disk_used_bytes"]) - (start_used or 0))
        with contextlib.suppress(OSError):
            _, metrics = _http(self.url + "/metrics", 5)
            for line in metrics.decode().splitlines():
                if (
                    line.startswith("kura_bootstrap_artifact_results")
                    and 'result="applied"' in line
                ):
                    rep.bootstrap_applied_artifacts += int(float(line.rsplit(" ", 1)[1]))
        assert rep.kura_up_at is not None
        rep.bootstrap_seconds = rep.ready_at - rep.kura_up_at
        if rep.bootstrap_seconds > 0:
            rep.bootstrap_mib_per_second = rep.refill_bytes / MiB / rep.bootstrap_seconds
        self.run.say(
            f"{self.name}: /ready 200 again {rep.bootstrap_seconds:.1f}s after boot "
            f"(refilled {rep.refill_bytes / MiB:.1f} MiB, {rep.bootstrap_applied_artifacts} "
            f"artifacts by bootstrap; tmp peak {rep.tmp_peak_bootstrap_bytes / MiB:.1f} of "
            f"{rep.tmp_budget_bytes / MiB:.0f} MiB)"
        )


# --- load --------------------------------------------------------------------------------------


@dataclass
class Artifact:
    protocol: str
    key: str
    size: int
    sha256: str  # of the body a GET must return
    writer: str
    acked_at: float
    pre_run: bool

    def get_path(self) -> str:
        if self.protocol == "http":
            return f"/cache/{self.key}"
        if self.protocol == "nx":
            return f"/v1/cache/{self.key}"
        if self.protocol == "turbo":
            return f"/v8/artifacts/{self.key}?{TURBO_QUERY}"
        return f"/api/cache/keyvalue/{self.key}?{KEYVALUE_QUERY}"


@dataclass
class Op:
    kind: str  # "read" or "write"
    host: str
    started: float
    ended: float
    judged: bool  # the node was up for the whole request


class Load:
    """Seeds, then writes and reads through several protocols across the nodes that are up,
    then verifies every acknowledged artifact on every node."""

    def __init__(self, run: Rolling) -> None:
        self.run = run
        self.rng = random.Random(run.config.seed)
        self.report = LoadReport()
        self.pre: list[Artifact] = []
        self.acked: list[Artifact] = []
        self.ops: list[Op] = []  # requests of the rolling phase only (not seeding)
        self.recording = False
        self.counter = 0
        self.session: aiohttp.ClientSession | None = None

    async def open(self) -> None:
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=64, force_close=True),
            timeout=aiohttp.ClientTimeout(total=60),
        )

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()

    def violation(self, text: str) -> None:
        self.report.violations.append(text)
        self.run.say(f"VIOLATION: {text}")

    # -- artifacts --

    def _size(self, cap: int) -> int:
        r = self.rng.random()
        if r < 0.5:
            return self.rng.randint(1 * KiB, 64 * KiB)
        if r < 0.85:
            return min(cap, self.rng.randint(64 * KiB, 1 * MiB))
        return min(cap, self.rng.randint(1 * MiB, self.run.config.max_artifact_bytes))

    def _new(self, protocol: str, cap: int) -> tuple[str, str, dict[str, str], bytes, Artifact]:
        """(method, path, headers, body, artifact) for one new artifact."""
        self.counter += 1
        n, run_id = self.counter, self.run.run_id
        if protocol == "keyvalue":
            raw = self.rng.randbytes(self.rng.randint(64, 48 * KiB))
            cas_id = f"rr-{run_id}-{n}"
            entries = [{"value": base64.b64encode(raw).decode()}]
            body = json.dumps({"cas_id": cas_id, "entries": entries}).encode()
            stored = json.dumps({"entries": entries}, separators=(",", ":")).encode()
            art = Artifact(protocol, cas_id, len(stored), _sha(stored), "", 0.0, False)
            path = f"/api/cache/keyvalue?{KEYVALUE_QUERY}"
            return "PUT", path, {"Content-Type": "application/json"}, body, art
        body = self.rng.randbytes(self._size(cap))
        if protocol == "http":
            key = f"rolling/{run_id}/{n}"
        elif protocol == "nx":
            key = str(self.rng.getrandbits(62) * 1000 + n % 1000)
        else:
            key = f"{run_id}{n:08d}{self.rng.getrandbits(64):016x}"
        art = Artifact(protocol, key, len(body), _sha(body), "", 0.0, False)
        headers = {"Content-Type": "application/octet-stream"}
        path = art.get_path()
        return "PUT", path, headers, body, art

    # -- one request --

    def _up_hosts(self) -> list[Host]:
        return [h for h in self.run.hosts if h.up]

    async def _request(
        self, host: Host, method: str, path: str, headers: dict[str, str], body: bytes | None
    ) -> tuple[int, bytes, str, float, float, bool]:
        """(status, body, error, started, ended, judged); status 0 on a transport error."""
        assert self.session is not None
        up0, gen0 = host.snapshot()
        host.inflight += 1
        started = time.time()
        status, data, error = 0, b"", ""
        try:
            payload = None if body is None else io.BytesIO(body)
            async with self.session.request(
                method, host.url + path, data=payload, headers=headers
            ) as resp:
                status = resp.status
                data = await resp.read()
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            error = f"{type(exc).__name__}: {exc}"
        finally:
            host.inflight -= 1
        ended = time.time()
        up1, gen1 = host.snapshot()
        return status, data, error, started, ended, up0 and up1 and gen0 == gen1

    async def write(
        self, protocol: str, cap: int, host: Host | None = None, pre: bool = False
    ) -> None:
        method, path, headers, body, art = self._new(protocol, cap)
        for attempt in range(4):
            target = host
            if target is None:
                candidates = self._up_hosts()
                if not candidates:
                    await asyncio.sleep(0.1)
                    continue
                target = self.rng.choice(candidates)
            self.report.write_attempts += 1
            status, data, error, t0, t1, judged = await self._request(
                target, method, path, headers, body
            )
            if self.recording:
                self.ops.append(Op("write", target.name, t0, t1, judged))
            if 200 <= status < 300:
                art.writer, art.acked_at, art.pre_run = target.name, t1, pre
                (self.pre if pre else self.acked).append(art)
                if pre:
                    self.report.seeded_artifacts += 1
                    self.report.seeded_bytes += art.size
                    by = self.report.seeded_by_protocol
                    by[protocol] = by.get(protocol, 0) + 1
                else:
                    self.report.run_writes_acked += 1
                    self.report.run_written_bytes += art.size
                return
            if not judged:
                self.report.writes_excused += 1
            elif status == 503:
                await asyncio.sleep(0.3 * (attempt + 1))  # Retry-After: tmp budget full
                continue
            else:
                self.report.write_errors_on_up_nodes += 1
                self.violation(
                    f"write {protocol} {art.key} to {target.name} (up) failed: "
                    f"{status or error} {data[:200]!r}"
                )
                return
            if host is not None:
                await asyncio.sleep(0.2)
        self.report.writes_shed_503 += 1

    async def read(self, art: Artifact, host: Host) -> None:
        status, data, error, t0, t1, judged = await self._request(
            host, "GET", art.get_path(), {}, None
        )
        self.report.reads += 1
        if self.recording:
            self.ops.append(Op("read", host.name, t0, t1, judged))
        if not judged:
            self.report.reads_excused += 1
            return
        if status == 200 and _sha(data) == art.sha256:
            self.report.reads_ok += 1
            return
        if status == 404 and not art.pre_run and art.writer != host.name:
            self.report.read_lag_misses += 1
            return
        self.report.read_failures_on_up_nodes += 1
        what = "written before the run" if art.pre_run else f"acknowledged by {art.writer}"
        got = f"{status} {len(data)} bytes" if status else error
        self.violation(
            f"read of {art.protocol} {art.key} ({what}) from {host.name} (up) failed: {got}"
        )

    # -- phases --

    async def seed(self, total_bytes: int) -> None:
        """Write about ``total_bytes`` across protocols and nodes (every node is up)."""
        hosts = self.run.hosts
        queue: asyncio.Queue[tuple[str, Host]] = asyncio.Queue()
        planned = 0
        i = 0
        # Plan by expected size: keep writing until the seeded bytes reach the target.
        while planned < total_bytes * 3 + 10:  # an upper bound on the number of writes
            protocol = self.rng.choices(PROTOCOLS, PROTOCOL_WEIGHTS)[0]
            queue.put_nowait((protocol, hosts[i % len(hosts)]))
            planned += 600 * KiB
            i += 1

        async def worker() -> None:
            while self.report.seeded_bytes < total_bytes:
                try:
                    protocol, host = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                await self.write(protocol, self.run.config.max_artifact_bytes, host, pre=True)

        await asyncio.gather(*(worker() for _ in range(4)))

    async def run_until(self, stop: asyncio.Event) -> None:
        cfg = self.run.config
        started = time.time()
        self.recording = True
        tasks: set[asyncio.Task[None]] = set()
        writes = asyncio.Semaphore(3)
        reads = asyncio.Semaphore(8)

        def spawn(coro: Coroutine[Any, Any, None], sem: asyncio.Semaphore) -> None:
            async def guarded() -> None:
                try:
                    await coro
                finally:
                    sem.release()

            task = asyncio.create_task(guarded())
            tasks.add(task)
            task.add_done_callback(tasks.discard)

        try:
            next_write = next_read = time.monotonic()
            while not stop.is_set():
                now = time.monotonic()
                if now >= next_write and not writes.locked():
                    await writes.acquire()
                    protocol = self.rng.choices(PROTOCOLS, PROTOCOL_WEIGHTS)[0]
                    spawn(self.write(protocol, cfg.run_write_max_bytes), writes)
                    next_write = now + self.rng.expovariate(cfg.write_rate)
                if now >= next_read and not reads.locked():
                    candidates = self._up_hosts()
                    if candidates:
                        pool = self.acked if self.acked and self.rng.random() < 0.4 else self.pre
                        art = self.rng.choice(pool)
                        await reads.acquire()
                        spawn(self.read(art, self.rng.choice(candidates)), reads)
                    next_read = now + self.rng.expovariate(cfg.read_rate)
                await asyncio.sleep(max(0.001, min(next_write, next_read, now + 0.05) - now))
            if tasks:
                await asyncio.wait(set(tasks))
        finally:  # cancelled (the demo is stopping): no request may outlive the session
            for task in list(tasks):
                task.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
        self.recording = False
        elapsed = max(1e-6, time.time() - started)
        self.report.ops_per_second = len(self.ops) / elapsed

    def ops_in_last(self, seconds: float) -> tuple[int, int]:
        """(writes, reads) that ended in the last ``seconds``."""
        cutoff = time.time() - seconds
        recent = [o for o in self.ops[-5000:] if o.ended >= cutoff]
        return sum(o.kind == "write" for o in recent), sum(o.kind == "read" for o in recent)

    async def verify(self) -> tuple[int, list[str]]:
        """Read every acknowledged artifact from every node; (reads, lost descriptions)."""
        assert self.session is not None
        lost: list[str] = []
        sem = asyncio.Semaphore(8)
        count = 0

        async def check(art: Artifact, host: Host) -> None:
            nonlocal count
            async with sem:
                assert self.session is not None
                status, data, error = 0, b"", ""
                for _ in range(3):
                    try:
                        async with self.session.get(host.url + art.get_path()) as resp:
                            status, data = resp.status, await resp.read()
                        break
                    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                        error = f"{type(exc).__name__}: {exc}"
                        await asyncio.sleep(0.5)
                count += 1
                if status != 200 or _sha(data) != art.sha256:
                    got = f"{status} {len(data)} bytes" if status else error
                    lost.append(f"{art.protocol} {art.key} on {host.name}: {got}")

        await asyncio.gather(*(check(a, h) for a in self.pre + self.acked for h in self.run.hosts))
        return count, lost

    def latencies(self, windows: list[tuple[float, float, str]]) -> None:
        """p50/p99 of judged reads and writes, during any reboot window and outside them; reads
        during a window also split by whether the rebooting (joining) node served them."""

        def during(op: Op) -> bool:
            return any(op.started < end and op.ended > start for start, end, _ in windows)

        joining = [
            1000 * (op.ended - op.started)
            for op in self.ops
            if op.judged
            and op.kind == "read"
            and any(
                op.host == host and op.started < end and op.ended > start
                for start, end, host in windows
            )
        ]
        self.report.reads_on_joining_node = len(joining)
        self.report.read_p99_ms_joining_node = percentile(joining, 99)

        groups: dict[tuple[str, bool], list[float]] = {}
        for op in self.ops:
            if op.judged:
                groups.setdefault((op.kind, during(op)), []).append(1000 * (op.ended - op.started))
        r = self.report
        rd, ro = groups.get(("read", True), []), groups.get(("read", False), [])
        r.reads_during_reboot, r.reads_outside_reboot = len(rd), len(ro)
        r.read_p50_ms_during, r.read_p99_ms_during = percentile(rd, 50), percentile(rd, 99)
        r.read_p50_ms_outside, r.read_p99_ms_outside = percentile(ro, 50), percentile(ro, 99)
        r.write_p99_ms_during = percentile(groups.get(("write", True), []), 99)
        r.write_p99_ms_outside = percentile(groups.get(("write", False), []), 99)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --- real build tools ---------------------------------------------------------------------------


class Clients:
    """Runs tests/clients/{nx,turbo,ccache}.sh against a node that is up."""

    SCRIPT_SETTINGS = ("TOKEN", "KEEP", "LAYOUT", "PREFIX", "TEAM", "TEAMID", "SIGNATURE_KEY")

    def __init__(self, run: Rolling, repo: Path, tools: Path) -> None:
        self.run = run
        self.dir = repo / "tests" / "clients"
        self.tools = tools
        self.runs: list[ClientRun] = []
        self.rng = random.Random(run.config.seed + 1)

    @staticmethod
    def missing(repo: Path | None) -> str:
        """Why the real clients cannot run here ('' when they can)."""
        if repo is None:
            return "not run from a kura checkout (tests/clients/ not found)"
        scripts = [repo / "tests" / "clients" / f"{c}.sh" for c in CLIENT_NAMES]
        if not all(p.is_file() for p in scripts):
            return f"driver scripts missing under {repo / 'tests' / 'clients'}"
        tools = Path(os.environ.get("KURA_TOOLS", repo / ".tools"))
        need = [tools / "npm" / "node_modules" / ".bin" / t for t in ("nx", "turbo")]
        absent = [str(p) for p in need if not os.access(p, os.X_OK)]
        absent += [b for b in ("ccache", "gcc", "node", "git") if shutil.which(b) is None]
        if absent:
            return "missing " + ", ".join(absent) + " (run scripts/install-deps)"
        return ""

    async def run_one(self, phase: str, client: str) -> ClientRun:
        hosts = [h for h in self.run.hosts if h.up]
        while not hosts:
            await asyncio.sleep(0.1)
            hosts = [h for h in self.run.hosts if h.up]
        host = self.rng.choice(hosts)
        env = {k: v for k, v in os.environ.items() if k not in self.SCRIPT_SETTINGS}
        env["KURA_TOOLS"] = str(self.tools)
        if client == "ccache":
            env.update({"PREFIX": "/cache", "LAYOUT": "subdirs"})
        up0, gen0 = host.snapshot()
        started = time.time()
        proc = await asyncio.create_subprocess_exec(
            "bash",
            str(self.dir / f"{client}.sh"),
            host.url,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            stdin=asyncio.subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), CLIENT_TIMEOUT_SECONDS)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            out, _ = await proc.communicate()
        except asyncio.CancelledError:  # the demo is stopping (Ctrl-C): take the build down
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)  # its trap removes its temp dir
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), 10)
            raise
        ended = time.time()
        up1, gen1 = host.snapshot()
        text = out.decode(errors="replace")
        run = ClientRun(
            phase,
            client,
            host.name,
            started,
            ended,
            proc.returncode if proc.returncode is not None else -1,
            HIT_LINE.search(text) is not None,
            up0 and up1 and gen0 == gen1,
            output_tail=text[-1500:],
        )
        self.runs.append(run)
        word = "REMOTE HIT" if run.hit else f"no hit (rc={run.returncode})"
        self.run.say(
            f"client {client} ({phase}) against {host.name}: {word}, {ended - started:.1f}s"
        )
        return run

    async def each(self, phase: str) -> None:
        for client in CLIENT_NAMES:
            await self.run_one(phase, client)

    async def loop(self, stop: asyncio.Event) -> None:
        i = 0
        while not stop.is_set():
            await self.run_one("during", CLIENT_NAMES[i % len(CLIENT_NAMES)])
            i += 1


# --- the run -------------------------------------------------------------------------------------


class Rolling:
    def __init__(self, config: RollingConfig) -> None:
        if config.hosts < 2:
            raise DemoError("a rolling reboot needs at least 2 hosts")
        if config.max_artifact_bytes > config.tmp_budget_bytes:
            raise DemoError("the largest artifact must fit in the tmp budget")
        self.config = config
        self.run_id = time.strftime("%Y%m%d%H%M%S")
        self.workdir = config.workdir.resolve()
        self.events = self.workdir / "events.log"
        self.reboot_script = self.workdir / "reboot.sh"
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.result = RollingResult(
            config={
                k: (str(v) if isinstance(v, Path) else v)
                for k, v in dataclasses.asdict(config).items()
                if k != "progress"
            },
            workdir=str(self.workdir),
        )
        self.hosts: list[Host] = []
        self._print_lock = threading.Lock()
        self._t0 = time.time()
        self.repo = find_repo(config.repo)
        self.alert_regexp = ""
        self.sampler: TmpSampler
        self.etcd: Etcd
        self.prometheus: Prometheus
        self.load = Load(self)
        self.clients: Clients | None = None

    # -- reporting --

    def say(self, text: str) -> None:
        line = f"[{time.time() - self._t0:6.1f}s] {text}"
        with self._print_lock:
            if self.config.progress is not None:
                self.config.progress(line)
            with (self.workdir / "demo.log").open("a") as f:
                f.write(line + "\n")

    def event(self, host: str, what: str) -> None:
        with self._print_lock, self.events.open("a") as f:
            f.write(f"{time.time():.6f} {host} {what}\n")

    def violation(self, text: str) -> None:
        self.result.violations.append(text)
        self.say(f"VIOLATION: {text}")

    def note(self, text: str) -> None:
        self.result.notes.append(text)
        self.say(f"note: {text}")

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.time()
        self.say(f"== {name}")
        try:
            yield
        finally:
            end = time.time()
            self.result.phases[name] = {"start": start, "end": end, "seconds": end - start}

    # -- set-up --

    def preflight(self) -> None:
        for binary in ("etcd", "prometheus"):
            _which(binary)
        if self.repo is None:
            raise DemoError(
                "deploy/alerts/kura.rules.yml not found: run from a kura checkout (or pass "
                "--repo DIR); Prometheus loads the alert rules from there"
            )
        cfg = self.config
        if cfg.clients != "off":
            why = Clients.missing(self.repo)
            if why and cfg.clients == "require":
                raise DemoError(f"real clients required but {why}")
            if why:
                self.result.clients_skipped = why
                self.note(f"real clients skipped: {why}")
            else:
                tools = Path(os.environ.get("KURA_TOOLS", self.repo / ".tools"))
                self.clients = Clients(self, self.repo, tools)
        else:
            self.result.clients_skipped = "disabled (--no-clients)"

    def setup(self) -> None:
        cfg = self.config
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.reboot_script.write_text(REBOOT_SCRIPT)
        self.reboot_script.chmod(0o755)
        assert self.repo is not None
        rules = sorted((self.repo / "deploy" / "alerts").glob("*.rules.yml"))
        names = kura_alert_names(self.repo / "deploy" / "alerts" / "kura.rules.yml")
        if not names:
            raise DemoError("no alerts found in deploy/alerts/kura.rules.yml")
        self.alert_regexp = "^(" + "|".join(names) + ")$"
        self.result.prometheus["alert_filter_regexp"] = self.alert_regexp
        ports = pick_ports(3 * cfg.hosts + 3, random.Random())
        for i in range(cfg.hosts):
            self.hosts.append(Host(self, i, (ports[3 * i], ports[3 * i + 1], ports[3 * i + 2])))
        self.etcd = Etcd(self.workdir / "etcd", ports[-3:-1])
        self.prometheus = Prometheus(self.workdir / "prometheus", ports[-1], rules)
        self.sampler = TmpSampler({h.name: h.tmp_dir for h in self.hosts})
        self.sampler.start()
        self.etcd.start()
        self.say(f"etcd {self.etcd.url}")
        for h in self.hosts:
            h.dir.mkdir(parents=True, exist_ok=True)
            h.start()
            self.say(f"{h.name}: kura {h.url} (internal {h.internal_url})")
        for h in self.hosts:
            h.wait_routable()
            h.set_up(True)
        self.prometheus.start(
            [f"127.0.0.1:{h.port}" for h in self.hosts],
            [f"127.0.0.1:{h.metrics_port}" for h in self.hosts],
        )
        self.say(f"prometheus {self.prometheus.url} (rules: {', '.join(p.name for p in rules)})")
        for h in self.hosts:
            h.start_agent()
            self.say(f"{h.name}: kured {h.kured_url}")
        self._wait(lambda: all(_ready(h) for h in self.hosts), 120, "every node ready")
        self._check_prometheus()
        for h in self.hosts:
            h.start_supervisor()

    def _check_prometheus(self) -> None:
        assert self.repo is not None
        expected = set()
        for path in (self.repo / "deploy" / "alerts").glob("*.rules.yml"):
            expected |= set(kura_alert_names(path))
        loaded: list[dict[str, Any]] = []

        def rules_ok() -> bool:
            nonlocal loaded
            loaded = self.prometheus.rules()
            names = {r["name"] for r in loaded}
            return expected <= names and all(r["health"] == "ok" for r in loaded)

        def targets_up() -> bool:
            return all(t["health"] == "up" for t in self.prometheus.targets()) and len(
                self.prometheus.targets()
            ) == 2 * len(self.hosts)

        ok = self._wait(rules_ok, 60, "prometheus evaluating every rule", fatal=False)
        self.result.prometheus["rules"] = loaded
        self.result.prometheus["rules_loaded_ok"] = ok
        if not ok:
            self.violation(f"prometheus did not load and evaluate every rule: {loaded}")
        up = self._wait(targets_up, 60, "prometheus scraping every target", fatal=False)
        self.result.prometheus["targets"] = self.prometheus.targets()
        if not up:
            self.violation(f"prometheus does not scrape every target: {self.prometheus.targets()}")
        self.say(f"prometheus: {len(loaded)} rules evaluating, {2 * len(self.hosts)} targets up")

    def _wait(
        self, predicate: Callable[[], bool], timeout: float, what: str, fatal: bool = True
    ) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError, KeyError):
                if predicate():
                    return True
            time.sleep(0.1)
        if fatal:
            raise DemoError(f"timed out after {timeout:.0f}s waiting for {what}")
        return False

    async def _await(self, predicate: Callable[[], bool], seconds: float, what: str) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                ok = await asyncio.to_thread(predicate)
            except (OSError, ValueError, KeyError):
                ok = False
            if ok:
                return True
            await asyncio.sleep(0.2)
        self.violation(f"timed out after {seconds:.0f}s waiting for {what}")
        return False

    def read_through_timeout_ms(self) -> int:
        """The default 1 s, or long enough for the largest artifact at the throttled rate
        (read-through fetches through the same throttled peer route as bootstrap)."""
        rate = self.config.replication_limit_bytes_per_second
        if rate <= 0:
            return 1000
        return max(1000, int(3000 * self.config.max_artifact_bytes / rate))

    def drained(self) -> bool:
        return all(_json(h.url + "/status")["outbox_messages"] == 0 for h in self.hosts)

    # -- the phases --

    async def main(self) -> None:
        cfg = self.config
        res = self.result
        res.started_at = time.time()
        if cfg.handle_signals:
            loop, task = asyncio.get_running_loop(), asyncio.current_task()
            assert task is not None
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, task.cancel)
        with self.phase("setup"):
            await asyncio.to_thread(self.setup)
        await self.load.open()
        try:
            with self.phase("seed"):
                await self.load.seed(int(cfg.data_mb * 1000 * 1000))
                r = self.load.report
                self.say(
                    f"seeded {r.seeded_artifacts} artifacts, {r.seeded_bytes / MiB:.1f} MiB "
                    f"({', '.join(f'{k} {v}' for k, v in sorted(r.seeded_by_protocol.items()))})"
                )
                await self._await(self.drained, 120, "outboxes to drain after seeding")
                await self._await(lambda: all(_ready(h) for h in self.hosts), 60, "ready")
            if self.clients is not None:
                with self.phase("clients-before"):
                    await self.clients.each("before")
            with self.phase("rolling"):
                await self._rolling()
            with self.phase("drain"):
                await self._await(lambda: all(_ready(h) for h in self.hosts), 120, "ready")
                await self._await(self.drained, 120, "outboxes to drain")
            with self.phase("verify"):
                res.verified_reads, res.lost = await self.load.verify()
                res.artifacts_total = len(self.load.pre) + len(self.load.acked)
                self.say(
                    f"verified {res.artifacts_total} artifacts on {len(self.hosts)} nodes: "
                    f"{len(res.lost)} lost"
                )
            if self.clients is not None:
                with self.phase("clients-after"):
                    await self.clients.each("after")
        finally:
            await self.load.close()
        self._collect()

    async def _rolling(self) -> None:
        stop_load = asyncio.Event()
        stop_clients = asyncio.Event()
        load_task = asyncio.create_task(self.load.run_until(stop_load))
        clients_task = (
            asyncio.create_task(self.clients.loop(stop_clients)) if self.clients else None
        )
        try:
            await self._roll(load_task, clients_task, stop_load, stop_clients)
        finally:  # also when cancelled: stop the load and the builds before the session closes
            for task in (load_task, clients_task):
                if task is not None and not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task

    async def _roll(
        self,
        load_task: asyncio.Task[None],
        clients_task: asyncio.Task[None] | None,
        stop_load: asyncio.Event,
        stop_clients: asyncio.Event,
    ) -> None:
        res = self.result
        await asyncio.sleep(1.0)  # some load before the first reboot
        res.rolling_started_at = time.time()
        for h in self.hosts:
            h.sentinel.touch()
            self.event(h.name, "sentinel")
        self.say(f"every sentinel now asks for a reboot ({len(self.hosts)} hosts)")
        deadline = time.monotonic() + self.config.rolling_timeout_seconds
        last_progress = 0.0
        while time.monotonic() < deadline:
            if await asyncio.to_thread(self._rolling_done):
                res.finished = True
                break
            self._check_processes()
            if time.monotonic() - last_progress >= 2.0:
                last_progress = time.monotonic()
                self.say(self._progress_line())
            await asyncio.sleep(0.25)
        if not res.finished:
            self.violation(
                f"the rolling reboot did not finish within {self.config.rolling_timeout_seconds:.0f}s"
            )
        else:
            self.say("every host rebooted, is back and ready; the lock is free")
        await asyncio.sleep(1.0)  # some load after the last node is back
        stop_load.set()
        stop_clients.set()
        await load_task
        if clients_task is not None:
            await clients_task

    def _rolling_done(self) -> bool:
        """Every host rebooted, answered /ready 200 again, and its agent gave the lock back
        after the reboot; and every node is ready now."""
        for h in self.hosts:
            rep = h.report
            if rep.ready_at is None or rep.requested_at is None or h.rebooting:
                return False
            released = log_times(h.agent_log(), f"lock released by {h.name}")
            if not any(t >= rep.requested_at - 0.001 for t in released):
                return False
        return all(_ready(h) for h in self.hosts)

    def _check_processes(self) -> None:
        """A kura node or agent that exited although its host is not rebooting is a violation.
        The supervisor sets ``rebooting`` before it stops anything and replaces the process
        objects before clearing it, so reading ``rebooting`` after ``poll()`` is race-free."""
        for h in self.hosts:
            for what in ("kura", "kured"):
                proc = h.kura if what == "kura" else h.agent
                if proc is None or proc.poll() is None:
                    continue
                if h.rebooting or proc is not (h.kura if what == "kura" else h.agent):
                    continue
                self.violation(f"{h.name}: {what} exited on its own (rc={proc.returncode})")
                if what == "kura":
                    h.set_up(False)
                    h.kura = None
                else:
                    h.agent = None

    def _progress_line(self) -> str:
        t = time.time() - self.result.rolling_started_at
        parts = [f"rolling +{t:5.1f}s"]
        for h in self.hosts:
            rep = h.report
            if h.rebooting or (rep.requested_at and rep.kura_up_at is None):
                state = "REBOOTING"
            elif rep.kura_up_at and rep.ready_at is None:
                state = f"booting ({h.bootstrap_line or 'starting'})"
            elif rep.ready_at:
                state = "rebooted"
            else:
                state = "waiting"
            parts.append(f"{h.name} {state}")
        writes, reads = self.load.ops_in_last(2.0)
        r = self.load.report
        parts.append(f"load {(writes + reads) / 2:.0f} ops/s")
        parts.append(
            f"errors {r.read_failures_on_up_nodes + r.write_errors_on_up_nodes}"
            f" (excused {r.reads_excused + r.writes_excused})"
        )
        return " | ".join(parts)

    # -- after the run --

    def _collect(self) -> None:
        res = self.result
        res.hosts = [h.report for h in self.hosts]
        res.tmp_samples = self.sampler.samples
        for h in self.hosts:
            h.report.tmp_peak_run_bytes = self.sampler.peaks[h.name]
        history = []
        for h in self.hosts:
            log = h.agent_log()
            acquired = log_times(log, f"lock acquired by {h.name}")
            released = log_times(log, f"lock released by {h.name}")
            rebooting = log_times(log, f"rebooting node {h.name}")
            for a in acquired:
                rel = min((t for t in released if t >= a), default=None)
                reb = min((t for t in rebooting if t >= a), default=None)
                history.append({"host": h.name, "acquired": a, "rebooting": reb, "released": rel})
            if acquired:
                h.report.lock_acquired_at = acquired[0]
                h.report.lock_released_at = min(
                    (t for t in released if t >= acquired[0]), default=None
                )
        res.lock_history = sorted(history, key=lambda e: float(e["acquired"]))
        for t, host, what in read_events(self.events):
            if what == "reboot":
                for h in self.hosts:
                    if h.name == host and h.report.reboot_at is None:
                        h.report.reboot_at = t
        ordered = sorted(
            (h.report for h in self.hosts if h.report.reboot_at is not None),
            key=lambda r: r.reboot_at or 0.0,
        )
        for prev, nxt in itertools.pairwise(ordered):
            freed, ready = prev.lock_released_at, prev.ready_at
            handoff: dict[str, Any] = {
                "from": prev.name,
                "to": nxt.name,
                "from_lock_released": freed,
                "from_ready": ready,
                "to_lock_acquired": nxt.lock_acquired_at,
                "to_reboot": nxt.reboot_at,
            }
            if freed is not None and nxt.lock_acquired_at is not None:
                handoff["lock_free_seconds"] = nxt.lock_acquired_at - freed
            if freed is not None and ready is not None:
                # > 0: the lock was free but the gate (this node's /ready) still held the next
                # reboot back for this long.
                handoff["ready_after_release_seconds"] = ready - freed
            if ready is not None and nxt.reboot_at is not None:
                handoff["reboot_after_ready_seconds"] = nxt.reboot_at - ready
            res.handoffs.append(handoff)
        windows = self.reboot_windows()
        self.load.latencies(windows)
        res.load = self.load.report
        if self.clients is not None:
            for c in self.clients.runs:
                c.overlapped_reboot = any(
                    c.started_at < e and c.ended_at > s for s, e, _ in windows
                )
            res.clients = self.clients.runs
        with contextlib.suppress(OSError, ValueError, KeyError):
            span = max(60, int(time.time() - res.started_at) + 5)
            seen = self.prometheus.query(f"max_over_time(ALERTS[{span}s])")
            res.prometheus["alerts_seen"] = sorted(
                {f"{s['metric']['alertname']} ({s['metric'].get('alertstate', '')})" for s in seen}
            )
            # Which agents Prometheus saw held back by a closed or unreachable gate.
            gated = self.prometheus.query(
                f'max by (node, reason) (max_over_time(kured_blocking_reason{{reason=~"gate_.*"}}[{span}s])) == 1'
            )
            res.prometheus["agents_gate_blocked"] = sorted(
                f"{s['metric'].get('node', '')} ({s['metric'].get('reason', '')})" for s in gated
            )
        res.ended_at = time.time()
        observed = res.violations + self.load.report.violations
        res.violations = evaluate(res) + observed
        res.ok = not res.violations

    def reboot_windows(self) -> list[tuple[float, float, str]]:
        """(reboot started, back ready, host) per host (the reboot script's event, else the
        supervisor's request)."""
        out = []
        for h in self.hosts:
            rep = h.report
            start = rep.reboot_at or rep.requested_at
            if start is not None:
                out.append((start, rep.ready_at or time.time(), h.name))
        return out

    def shutdown(self) -> None:
        self.stopping.set()
        for h in self.hosts:
            h.join()
        for h in self.hosts:
            _stop(h.agent)
        for h in self.hosts:
            _stop(h.kura)
        with contextlib.suppress(AttributeError):
            self.prometheus.stop()
        with contextlib.suppress(AttributeError):
            self.etcd.stop()
        with contextlib.suppress(AttributeError):
            self.sampler.stop()
        if not self.config.keep:
            for h in self.hosts:
                shutil.rmtree(h.dir / "kura", ignore_errors=True)
            shutil.rmtree(self.workdir / "etcd" / "data", ignore_errors=True)
            shutil.rmtree(self.workdir / "prometheus" / "data", ignore_errors=True)


def _ready(host: Host) -> bool:
    try:
        return _http(host.url + "/ready", 2)[0] == 200
    except OSError:
        return False


# --- the invariants --------------------------------------------------------------------------


def evaluate(res: RollingResult) -> list[str]:
    """Every must-show invariant the recorded data violates (empty: all hold)."""
    out: list[str] = []
    hosts = res.hosts
    # All hosts rebooted, once each, strictly one at a time under the lock.
    for h in hosts:
        if h.reboot_at is None:
            out.append(f"{h.name} was never rebooted")
        elif h.reboots != 1:
            out.append(f"{h.name} was rebooted {h.reboots} times")
        if h.reboot_at is not None and h.ready_at is None:
            out.append(f"{h.name} never answered /ready 200 after its reboot")
    history = res.lock_history
    if len(history) != len(hosts):
        out.append(f"{len(history)} lock acquisitions for {len(hosts)} hosts: {history}")
    for prev, nxt in itertools.pairwise(history):
        if prev["released"] is None or nxt["acquired"] <= prev["released"]:
            out.append(
                f"lock overlap: {nxt['host']} acquired at {nxt['acquired']:.3f} before "
                f"{prev['host']} released ({prev['released']})"
            )
    by_name = {x.name: x for x in hosts}
    for entry in history:
        holder = by_name.get(entry["host"])
        if holder is None or holder.reboot_at is None:
            continue
        released = entry["released"]
        if not (
            entry["acquired"] <= holder.reboot_at + 0.002
            and (released is None or holder.reboot_at < released)
        ):
            out.append(f"{holder.name} rebooted at {holder.reboot_at:.3f} outside its lock {entry}")
    ordered = sorted((h for h in hosts if h.reboot_at is not None), key=lambda h: h.reboot_at or 0)
    for prev_h, next_h in itertools.pairwise(ordered):
        assert next_h.reboot_at is not None
        if prev_h.ready_at is None or next_h.reboot_at <= prev_h.ready_at:
            out.append(
                f"{next_h.name} rebooted at {next_h.reboot_at:.3f} before {prev_h.name} was "
                f"ready again ({prev_h.ready_at})"
            )
    # Nothing lost, no failed read on an up node.
    if res.lost:
        out.append(f"{len(res.lost)} artifact copies lost or wrong, e.g. {res.lost[:3]}")
    if res.artifacts_total and res.verified_reads != res.artifacts_total * len(hosts):
        out.append(f"verified {res.verified_reads} of {res.artifacts_total * len(hosts)} copies")
    if res.load.read_failures_on_up_nodes:
        out.append(f"{res.load.read_failures_on_up_nodes} reads failed on nodes that were up")
    if res.load.write_errors_on_up_nodes:
        out.append(f"{res.load.write_errors_on_up_nodes} writes failed on nodes that were up")
    # The tmp budget held during every bootstrap (and the whole run).
    for h in hosts:
        for name, peak in h.tmp_peak_during_any_bootstrap.items():
            if peak > h.tmp_budget_bytes:
                out.append(
                    f"{name}'s tmp reached {peak} bytes (budget {h.tmp_budget_bytes}) while "
                    f"{h.name} bootstrapped"
                )
        if h.tmp_peak_run_bytes > h.tmp_budget_bytes:
            out.append(f"{h.name}'s tmp peaked at {h.tmp_peak_run_bytes} bytes over the run")
    # Real clients: a hit after the run; during it, a run overlapped a reboot and every run
    # whose node stayed up got its hit.
    if not res.clients_skipped:
        for client in CLIENT_NAMES:
            after = [c for c in res.clients if c.phase == "after" and c.client == client]
            if not after or not all(c.hit for c in after):
                out.append(f"{client}: no REMOTE HIT after the run")
            before = [c for c in res.clients if c.phase == "before" and c.client == client]
            if not before or not all(c.hit for c in before):
                out.append(f"{client}: no REMOTE HIT before the run")
        during = [c for c in res.clients if c.phase == "during"]
        if not any(c.overlapped_reboot for c in during):
            out.append("no real client build ran while a host was rebooting")
        for c in during:
            if c.target_stayed_up and not c.hit:
                out.append(f"{c.client} against {c.host} (up throughout) got no hit during the run")
    if res.prometheus and not res.prometheus.get("rules_loaded_ok", False):
        out.append("prometheus did not load every alert rule")
    if not res.finished:
        out.append("the rolling reboot did not finish")
    return out


# --- entry point and terminal summary ----------------------------------------------------------


def run(config: RollingConfig) -> RollingResult:
    """Run the whole scenario; always stops every process it started. Raises DemoError when it
    cannot start. The JSON summary is written to ``<workdir>/summary.json``."""
    demo = Rolling(config)
    demo.workdir.mkdir(parents=True, exist_ok=True)
    try:
        demo.preflight()
        asyncio.run(demo.main())
    except asyncio.CancelledError:
        raise KeyboardInterrupt from None  # a signal cancelled the run (handle_signals)
    finally:
        demo.shutdown()
        demo.result.hosts = [h.report for h in demo.hosts]
        summary = demo.workdir / "summary.json"
        demo.result.summary_path = str(summary)
        summary.write_text(demo.result.to_json())
    return demo.result


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f} ms"


def render_summary(res: RollingResult) -> str:
    t0 = res.rolling_started_at or res.started_at

    def rel(t: float | None) -> str:
        return "-" if t is None else f"+{t - t0:.1f}s"

    lines = ["", "phase            seconds"]
    for name, p in res.phases.items():
        lines.append(f"  {name:<15}{p['seconds']:7.1f}")
    lines.append("")
    header = (
        f"{'host':<6} {'stop':<8} {'wiped':<6} {'reboot':>8} {'ready':>8} {'boot→ready':>10} "
        f"{'refill':>10} {'MiB/s':>7}  tmp on disk / reserved / budget"
    )
    lines.append(header)
    for h in sorted(res.hosts, key=lambda h: h.reboot_at or float("inf")):
        boot = "-" if h.bootstrap_seconds is None else f"{h.bootstrap_seconds:.1f}s"
        rate = "-" if h.bootstrap_mib_per_second is None else f"{h.bootstrap_mib_per_second:.1f}"
        tmp = (
            f"{h.tmp_peak_bootstrap_bytes / MiB:.1f} / {h.tmp_reserved_peak_bytes / MiB:.1f} / "
            f"{h.tmp_budget_bytes / MiB:.0f} MiB"
        )
        lines.append(
            f"{h.name:<6} {h.stop_signal:<8} {'yes' if h.wiped else 'no':<6} "
            f"{rel(h.reboot_at):>8} {rel(h.ready_at):>8} {boot:>10} "
            f"{h.refill_bytes / MiB:>6.1f} MiB {rate:>7}  {tmp}"
        )
    lines.append("")
    lines.append("lock history (kured agent logs):")
    for e in res.lock_history:
        lines.append(
            f"  {e['host']:<6} acquired {rel(e['acquired'])}  released {rel(e['released'])}"
        )
    for hand in res.handoffs:
        after = hand.get("reboot_after_ready_seconds")
        held = hand.get("ready_after_release_seconds")
        text = f"  {hand['from']} -> {hand['to']}: next reboot "
        text += "-" if after is None else f"{after:.2f}s after {hand['from']} was ready again"
        if held is not None and held > 0:
            text += f"; the gate kept the free lock for {held:.1f}s until then"
        lines.append(text)
    ld = res.load
    lines += [
        "",
        f"load: seeded {ld.seeded_artifacts} artifacts ({ld.seeded_bytes / MiB:.1f} MiB); during the run "
        f"{ld.run_writes_acked} writes acknowledged ({ld.run_written_bytes / MiB:.1f} MiB), "
        f"{ld.reads} reads, {ld.ops_per_second:.0f} ops/s",
        f"  failures on up nodes: reads {ld.read_failures_on_up_nodes}, writes "
        f"{ld.write_errors_on_up_nodes}; shed 503 {ld.writes_shed_503}; replication-lag misses "
        f"{ld.read_lag_misses}; cut by a reboot (excused) {ld.reads_excused + ld.writes_excused}",
        f"  read latency during reboots: p50 {_ms(ld.read_p50_ms_during)}, p99 "
        f"{_ms(ld.read_p99_ms_during)} (n={ld.reads_during_reboot}; of these, served by the "
        f"rebooting node while it booted: p99 {_ms(ld.read_p99_ms_joining_node)}, "
        f"n={ld.reads_on_joining_node})",
        f"  read latency outside reboots: p50 {_ms(ld.read_p50_ms_outside)}, p99 "
        f"{_ms(ld.read_p99_ms_outside)} (n={ld.reads_outside_reboot})",
        f"lost artifacts: {len(res.lost)} of {res.artifacts_total} (each read from every node: "
        f"{res.verified_reads} reads)",
    ]
    if res.clients_skipped:
        lines.append(f"real clients: skipped ({res.clients_skipped})")
    else:
        by_phase: dict[str, list[str]] = {}
        for c in res.clients:
            mark = "HIT" if c.hit else f"MISS(rc={c.returncode})"
            flag = "*" if c.overlapped_reboot else ""
            by_phase.setdefault(c.phase, []).append(f"{c.client}@{c.host} {mark}{flag}")
        lines.append("real clients (* = while a host was rebooting):")
        for phase in ("before", "during", "after"):
            lines.append(f"  {phase:<7} " + ", ".join(by_phase.get(phase, [])))
    prom = res.prometheus
    if prom:
        rules = prom.get("rules", [])
        lines.append(
            f"prometheus: {len(rules)} rules loaded ({'ok' if prom.get('rules_loaded_ok') else 'NOT ok'}); "
            f"alerts seen: {', '.join(prom.get('alerts_seen', [])) or 'none'}"
        )
        lines.append(
            "  agents held back by a gate at some point: "
            + (", ".join(prom.get("agents_gate_blocked", [])) or "none")
        )
    lines.append("")
    if res.ok:
        lines.append("result: OK — every invariant held")
    else:
        lines.append(f"result: FAILED — {len(res.violations)} violations:")
        lines += [f"  - {v}" for v in res.violations[:30]]
    lines.append(f"summary: {res.summary_path}")
    return "\n".join(lines)


def main(
    *,
    data_mb: float,
    hosts: int,
    workdir: str,
    keep: bool,
    tmp_mb: float,
    clients: bool,
    repo: str | None,
    timeout: float,
    route_before_discovery: bool = False,
    bootstrap_limit_mib: float = 3.0,
    downloads_per_peer: int = 1,
) -> int:
    """``kura demo rolling-reboot``: 0 when every invariant held, 1 when one did not, 2 when
    the demo could not run."""
    run_dir = Path(workdir) / f"rolling-{time.strftime('%Y%m%d-%H%M%S')}"

    def progress(line: str) -> None:
        print(line, flush=True)

    config = RollingConfig(
        workdir=run_dir,
        hosts=hosts,
        data_mb=data_mb,
        tmp_budget_bytes=int(tmp_mb * MiB),
        max_artifact_bytes=min(4 * MiB, int(tmp_mb * MiB) // 2),
        clients="auto" if clients else "off",
        repo=Path(repo) if repo else None,
        keep=keep,
        rolling_timeout_seconds=timeout,
        route_before_discovery=route_before_discovery,
        handle_signals=True,
        replication_limit_bytes_per_second=int(bootstrap_limit_mib * MiB),
        bootstrap_downloads_per_peer=downloads_per_peer,
        progress=progress,
    )
    print(
        f"kura demo rolling-reboot: {hosts} hosts, {data_mb:g} MB of artifacts, work dir {run_dir}"
    )

    def interrupt(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt  # outside the event loop (start-up, shutdown): like Ctrl-C

    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        result = run(config)
    except DemoError as exc:
        print(f"kura demo: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("kura demo: interrupted; every process stopped", file=sys.stderr)
        return 130
    print(render_summary(result))
    return 0 if result.ok else 1
