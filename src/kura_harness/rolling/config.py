"""What a rolling-reboot run is told (``RollingConfig``) and what it records (``RollingResult``
with one ``HostReport`` per host, the ``LoadReport`` and every ``ClientRun``), plus the
scenario's constants.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kura_harness.launch import LaunchError

KiB = 1024
MiB = 1024 * KiB

CLIENT_NAMES = ("nx", "turbo", "ccache")
PROTOCOLS = ("http", "nx", "turbo", "keyvalue")
PROTOCOL_WEIGHTS = (35, 25, 25, 15)
KEYVALUE_QUERY = "tenant_id=demo&namespace_id=rolling"
TURBO_QUERY = "slug=rolling"
HIT_LINE = re.compile(r"^REMOTE HIT\b", re.MULTILINE)
ALERT_LINE = re.compile(r"^\s*-\s*alert:\s*([A-Za-z_][A-Za-z0-9_]*)\s*$", re.MULTILINE)
BOOTSTRAP_PCT = re.compile(r"bootstrap in progress: .*?(\d+)% of bytes")
LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}) \S+ \S+ (.*)$")
CLIENT_TIMEOUT_SECONDS = 180.0

REBOOT_SCRIPT = """#!/bin/sh
# kured's --reboot-command in `kura demo rolling-reboot`: record the reboot, clear the sentinel
# (a boot clears /var/run), and ask the demo's host supervisor to power-cycle this host.
# Usage: reboot.sh HOST EVENTS_LOG SENTINEL REQUEST_FILE
echo "$(date +%s.%N) $1 reboot" >> "$2"
rm -f "$3"
touch "$4"
"""


class DemoError(LaunchError):
    """The demo cannot run here (a missing binary, a port that never bound, ...)."""


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
    # Seconds of the full load (reads, writes, real builds) before the first reboot and after
    # the last: the "outside reboots" latencies the ones during reboots are compared with.
    baseline_seconds: float = 1.0
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
    ready_at: float | None = None  # first /ready 200 after the restart (when it was asked for)
    # When the last refusal of /ready before that 200 was asked for: the node was still not
    # ready at some moment at or after it. Its switch to ready lies in (this, ready_at].
    last_not_ready_at: float | None = None

    def surely_not_ready_at(self) -> float | None:
        """The latest moment the observer knows the node was not ready yet after its restart:
        its last refused ``/ready``, else its listen line (None before it restarted)."""
        return self.last_not_ready_at if self.last_not_ready_at is not None else self.kura_up_at

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
    # ... and those served by the other nodes, which stayed up (bootstrap's sources).
    reads_during_on_other_nodes: int = 0
    read_p99_ms_during_other_nodes: float | None = None
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
