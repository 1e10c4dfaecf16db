#!/usr/bin/env python3
"""What one asyncio.current_task() call costs inside a running task (timeit, no sampler).

    .venv/bin/python bench/current_task_cost.py

The 1 KiB GET profiles (docs/benchmarks.md, "Per-request work on aiohttp") charge a share of
the event loop's self samples to current_task; this measures the call itself, so the share can
be set against the call's real cost. Prints one JSON object: the Python version, the loop, and
the best of --repeat timings per call in microseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import timeit


async def _measure(number: int, repeat: int) -> list[float]:
    return timeit.repeat(asyncio.current_task, number=number, repeat=repeat)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--number", type=int, default=1_000_000, help="calls per timing")
    ap.add_argument("--repeat", type=int, default=7)
    a = ap.parse_args()
    load = os.getloadavg()
    times = asyncio.run(_measure(a.number, a.repeat))
    per_call = sorted(t / a.number * 1e6 for t in times)
    print(
        json.dumps(
            {
                "python": platform.python_version(),
                "c_current_task": asyncio.current_task.__module__ != "asyncio.tasks",
                "calls_per_timing": a.number,
                "best_us_per_call": round(per_call[0], 3),
                "median_us_per_call": round(per_call[len(per_call) // 2], 3),
                "load_before": [round(x, 2) for x in load],
            }
        )
    )


if __name__ == "__main__":
    main()
