"""The load generator: seeds artifacts, then writes and reads through the plain HTTP, Nx,
Turborepo and key-value routes across the nodes that are up, judges every read (see the
package docstring, "What counts as a failed read"), and at the end verifies every
acknowledged artifact on every node.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import json
import random
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiohttp

from kura_harness.rolling.config import (
    KEYVALUE_QUERY,
    PROTOCOL_WEIGHTS,
    PROTOCOLS,
    TURBO_QUERY,
    KiB,
    LoadReport,
    MiB,
)
from kura_harness.rolling.observe import percentile

if TYPE_CHECKING:
    from kura_harness.rolling.host import Host
    from kura_harness.rolling.scenario import Rolling


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
    size: int = 0  # the artifact's bytes (read) or the body's (write)


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
                self.ops.append(Op("write", target.name, t0, t1, judged, len(body)))
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
            self.ops.append(Op("read", host.name, t0, t1, judged, art.size))
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

        def on_joining_node(op: Op) -> bool:
            return any(
                op.host == host and op.started < end and op.ended > start
                for start, end, host in windows
            )

        reads_during = [op for op in self.ops if op.judged and op.kind == "read" and during(op)]
        joining = [1000 * (op.ended - op.started) for op in reads_during if on_joining_node(op)]
        others = [1000 * (op.ended - op.started) for op in reads_during if not on_joining_node(op)]
        self.report.reads_on_joining_node = len(joining)
        self.report.read_p99_ms_joining_node = percentile(joining, 99)
        self.report.reads_during_on_other_nodes = len(others)
        self.report.read_p99_ms_during_other_nodes = percentile(others, 99)

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
