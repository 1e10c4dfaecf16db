"""The real build tools: runs tests/clients/{nx,turbo,ccache}.sh against a node that is up."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING

from kura_harness.rolling.config import CLIENT_NAMES, CLIENT_TIMEOUT_SECONDS, HIT_LINE, ClientRun

if TYPE_CHECKING:
    from kura_harness.rolling.scenario import Rolling


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
