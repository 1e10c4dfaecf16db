"""``kura demo rolling-reboot``: ``run(config)`` (the whole scenario, every process stopped at the
end) and ``main`` (flags to a ``RollingConfig``, the run, the summary, the exit code)."""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from pathlib import Path

from kura_harness.launch import LaunchError
from kura_harness.rolling.config import MiB, RollingConfig, RollingResult
from kura_harness.rolling.scenario import Rolling
from kura_harness.rolling.summary import render_summary


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
    kura_env: dict[str, str] | None = None,
    baseline_seconds: float = 10.0,
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
        extra_kura_env=kura_env or {},
        baseline_seconds=baseline_seconds,
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
    except LaunchError as exc:
        print(f"kura demo: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("kura demo: interrupted; every process stopped", file=sys.stderr)
        return 130
    print(render_summary(result))
    return 0 if result.ok else 1
