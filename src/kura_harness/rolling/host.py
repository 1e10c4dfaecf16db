"""One host of the run: a kura node, a kured agent and the supervisor thread that "reboots"
them when kured's reboot command asks (see the package docstring).
"""

from __future__ import annotations

import contextlib
import http.client
import shlex
import shutil
import signal
import subprocess
import threading
import time
from typing import TYPE_CHECKING

from kit.wait import wait_until
from kura_harness.launch import LaunchError
from kura_harness.launch.node import kura_env, spawn_kura, spawn_kured
from kura_harness.launch.process import get_json, http_get, stop
from kura_harness.rolling.config import BOOTSTRAP_PCT, HostReport, MiB
from kura_harness.rolling.observe import signal_name

if TYPE_CHECKING:
    from kura_harness.rolling.scenario import Rolling


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
            signal_name(self.stop_signal),
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
        """The node's environment: fixed ports (kept across restarts), every host as a peer,
        the scenario's tmp budget and bootstrap pace, then ``extra_kura_env``."""
        cfg = self.run.config
        settings = {
            "host": "127.0.0.1",
            "port": self.port,
            "internal_port": self.internal_port,
            "node_url": self.internal_url,
            "peers": ",".join(h.internal_url for h in self.run.hosts),
            "region": self.name,
            "tmp_dir_max_bytes": cfg.tmp_budget_bytes,
            "discovery_settle_ms": cfg.settle_ms,
            "discovery_interval_ms": 500,
            "discovery_initial_timeout_ms": 15000,
            "replication_backoff_max_ms": 4000,
            "shutdown_timeout_seconds": 10,
            "read_through": "joining",
            "read_through_timeout_ms": self.run.read_through_timeout_ms(),
            "replication_bandwidth_limit_bytes_per_second": cfg.replication_limit_bytes_per_second,
            "bootstrap_downloads_per_peer": cfg.bootstrap_downloads_per_peer,
        }
        env = kura_env(self.data_dir, self.tmp_dir, settings)
        env.update(cfg.extra_kura_env)
        return env

    def start_kura(self) -> None:
        self.kura_starts += 1
        log = self.dir / f"kura-{self.kura_starts}.log"
        last: LaunchError | None = None
        for attempt in range(5):  # a port still held by a dying socket: try again shortly
            try:
                self.kura = spawn_kura(self.kura_env(), log, cwd=self.dir).proc
                return
            except LaunchError as exc:
                last = exc
                time.sleep(0.5 * (attempt + 1))
        assert last is not None
        raise last

    def agent_flags(self) -> list[str]:
        """kured's flags on this host (etcd lock, every node's /ready and the kura alerts as
        gates, reboot.sh as the reboot command)."""
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
        last: LaunchError | None = None
        for attempt in range(5):
            try:
                self.agent, _ = spawn_kured(
                    self.agent_flags(), self.dir / "kured.log", what=f"kured on {self.name}"
                )
                break
            except LaunchError as exc:
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
        if wait_until(
            lambda: int(get_json(self.url + "/up", 2)["ring_members"]) >= want,
            30,
            interval=0.005,
            ignoring=(OSError, ValueError, KeyError),
            give_up=self.run.stopping.is_set,
        ):
            return
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
        stop(self.kura, self.stop_signal, timeout=30)
        rep.stopped_at = time.time()
        run.event(self.name, "kura-stopped")
        if self.wipe:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            shutil.rmtree(self.tmp_dir, ignore_errors=True)
            run.event(self.name, "wiped")
        stop(self.agent, signal.SIGKILL)
        run.event(self.name, "agent-killed")
        how = signal_name(self.stop_signal) + (", data dir wiped" if self.wipe else "")
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
        wait_until(lambda: self.inflight == 0, 15, interval=0.01)
        if wait_until(
            lambda: get_json(self.url + "/status")["outbox_messages"] == 0,
            30,
            ignoring=(OSError, ValueError),
        ):
            return
        self.run.note(f"{self.name}: outbox not empty after 30 s of draining; wiping anyway")

    def _watch_ready(self) -> None:
        """From the restart until /ready answers 200: poll it over one kept-alive connection,
        every 20 ms while bootstrap is below 90 %, every 2 ms after; ``ready_at`` is when the
        first 200 was asked for (the switch lies between it and the answer, within one poll
        of the last refusal); sample /status every 0.1 s for the progress line and
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
                    st = get_json(self.url + "/status", 2)
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
            asked_at = time.time()
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
                # When the 200 was asked for: the node switched before it answered, and an
                # answer that takes long (a loaded machine: 0.78 s once) must not move the
                # switch later than kured's own probe saw it.
                rep.ready_at = asked_at
                break
            rep.last_not_ready_at = asked_at
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
            st = get_json(self.url + "/status", 5)
            rep.refill_bytes = max(0, int(st["disk_used_bytes"]) - (start_used or 0))
        with contextlib.suppress(OSError):
            _, metrics = http_get(self.url + "/metrics", 5)
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
