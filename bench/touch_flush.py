#!/usr/bin/env python3
"""touch_flush: what the per-namespace index (``artifacts_by_namespace_access``, kept only
while ``KURA_NAMESPACE_RULES`` is set: ``storage.schema``) costs every touch flush.

Fills a fresh index with --rows artifacts (200 namespaces), then times ``MetadataIndex.touch``
of --touches random artifacts --runs times without the index, then with it, twice over
(interleaved, so a noisy neighbour hits both alike). Prints every time and the median (s).

    .venv/bin/python bench/touch_flush.py [--rows 500000] [--touches 10000] [--runs 7]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

from kura.storage.index import MetadataIndex


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=500_000)
    parser.add_argument("--touches", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        index = MetadataIndex(Path(tmp) / "index.sqlite3")
        conn = index.connection()
        conn.execute("BEGIN")
        conn.executemany(
            "INSERT INTO artifacts(artifact_id, producer, namespace_id, key, content_type, size,"
            " sha256, version_ms, created_at_ms, last_access_ms) VALUES (?,?,?,?,?,?,?,?,?,?)",
            (
                (f"{i:064x}", "http", f"ns{i % 200}", f"k{i}", "a/b", 1000 + i % 5000, "", i, i, i)
                for i in range(args.rows)
            ),
        )
        conn.execute("COMMIT")
        rng = random.Random(1)
        ids = [f"{i:064x}" for i in range(args.rows)]
        for wanted in (False, True, False, True):
            index.keep_namespace_access_index(wanted)
            times = []
            for run in range(args.runs):
                batch = {a: 10**12 + run for a in rng.sample(ids, args.touches)}
                started = time.perf_counter()
                index.touch(batch)
                times.append(time.perf_counter() - started)
            name = "with the rules index" if wanted else "without it"
            spread = " ".join(f"{t:.2f}" for t in sorted(times))
            print(f"{name}: {spread}  median {statistics.median(times):.2f} s", flush=True)
        index.close_all()


if __name__ == "__main__":
    main()
