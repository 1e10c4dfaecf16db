"""``Rolling``, one run: set up etcd, Prometheus and the hosts, seed, roll the reboot through
every host under load, drain, verify, and collect the result; ``shutdown`` stops every process
it started (``command.run`` always calls it).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import random
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from kit.wait import wait_until, wait_until_async
from kura_harness.launch.etcd import Etcd
from kura_harness.launch.process import get_json, stop, which
from kura_harness.launch.prometheus import Prometheus
from kura_harness.rolling.clients import Clients
from kura_harness.rolling.collect import collect
from kura_harness.rolling.config import REBOOT_SCRIPT, DemoError, MiB, RollingConfig, RollingResult
from kura_harness.rolling.host import Host
from kura_harness.rolling.load import Load
from kura_harness.rolling.observe import find_repo, kura_alert_names, log_times, pick_ports, ready
from kura_harness.rolling.sampler import TmpSampler
from kura_harness.rolling.summary import progress_line

INSTALL_HINT = (
    "the demo runs a real one (Debian: apt-get install etcd-server prometheus; "
    "or run scripts/install-deps)"
)


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
            which(binary, INSTALL_HINT)
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
        self.etcd = Etcd(self.workdir / "etcd", ports[-3:-1], name="demo")
        self.prometheus = Prometheus(
            self.workdir / "prometheus",
            rules,
            {
                "kura": [f"127.0.0.1:{h.port}" for h in self.hosts],
                "kured": [f"127.0.0.1:{h.metrics_port}" for h in self.hosts],
            },
            port=ports[-1],
        )
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
        self.prometheus.start()
        self.say(f"prometheus {self.prometheus.url} (rules: {', '.join(p.name for p in rules)})")
        for h in self.hosts:
            h.start_agent()
            self.say(f"{h.name}: kured {h.kured_url}")
        self._wait(lambda: all(ready(h.url) for h in self.hosts), 120, "every node ready")
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

        seen: list[dict[str, Any]] = []

        def targets_up() -> bool:
            nonlocal seen
            seen = self.prometheus.targets()  # the one answer both checks and the result use
            return all(t["health"] == "up" for t in seen) and len(seen) == 2 * len(self.hosts)

        ok = self._wait(rules_ok, 60, "prometheus evaluating every rule", fatal=False)
        self.result.prometheus["rules"] = loaded
        self.result.prometheus["rules_loaded_ok"] = ok
        if not ok:
            self.violation(f"prometheus did not load and evaluate every rule: {loaded}")
        up = self._wait(targets_up, 60, "prometheus scraping every target", fatal=False)
        self.result.prometheus["targets"] = seen
        if not up:
            self.violation(f"prometheus does not scrape every target: {seen}")
        self.say(f"prometheus: {len(loaded)} rules evaluating, {2 * len(self.hosts)} targets up")

    def _wait(
        self, predicate: Callable[[], bool], timeout: float, what: str, fatal: bool = True
    ) -> bool:
        if wait_until(predicate, timeout, interval=0.1, ignoring=(OSError, ValueError, KeyError)):
            return True
        if fatal:
            raise DemoError(f"timed out after {timeout:.0f}s waiting for {what}")
        return False

    async def _await(self, predicate: Callable[[], bool], seconds: float, what: str) -> bool:
        if await wait_until_async(
            lambda: asyncio.to_thread(predicate),
            seconds,
            interval=0.2,
            ignoring=(OSError, ValueError, KeyError),
        ):
            return True
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
        return all(get_json(h.url + "/status")["outbox_messages"] == 0 for h in self.hosts)

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
                await self._await(lambda: all(ready(h.url) for h in self.hosts), 60, "ready")
            if self.clients is not None:
                with self.phase("clients-before"):
                    await self.clients.each("before")
            with self.phase("rolling"):
                await self._rolling()
            with self.phase("drain"):
                await self._await(lambda: all(ready(h.url) for h in self.hosts), 120, "ready")
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
        collect(self)

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
        await asyncio.sleep(self.config.baseline_seconds)  # load before the first reboot
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
                self.say(progress_line(self))
            await asyncio.sleep(0.25)
        if not res.finished:
            self.violation(
                f"the rolling reboot did not finish within {self.config.rolling_timeout_seconds:.0f}s"
            )
        else:
            self.say("every host rebooted, is back and ready; the lock is free")
        await asyncio.sleep(self.config.baseline_seconds)  # load after the last node is back
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
        return all(ready(h.url) for h in self.hosts)

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

    # -- after the run --

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
            stop(h.agent)
        for h in self.hosts:
            stop(h.kura)
        with contextlib.suppress(AttributeError):
            self.prometheus.stop()
        with contextlib.suppress(AttributeError):
            self.etcd.stop()
        with contextlib.suppress(AttributeError):
            self.sampler.stop()
        if not self.config.keep:
            for h in self.hosts:
                shutil.rmtree(h.dir / "kura", ignore_errors=True)
            for data in (self.workdir / "etcd").glob("data-*"):
                shutil.rmtree(data, ignore_errors=True)
            shutil.rmtree(self.workdir / "prometheus" / "data", ignore_errors=True)
