#!/usr/bin/env python3
"""kura against nginx and turborepo-remote-cache, with the defaults docs/benchmarks.md uses.

    .venv/bin/python bench/cache_vs_peers.py            # full run, ~17 min on 2 cores
    .venv/bin/python bench/cache_vs_peers.py --quick    # smoke run, ~3 min

Runs bench/peers.py with --peers nginx,turbo,kura --subject kura, GET 1K/64K/1M/64M,
PUT 1K/1M/64M, one 1 GiB upload and download per repeat, --repeat 3, 10 s per wrk case, and
writes bench/results/<timestamp>.jsonl (every measurement) and .md (the tables). Any
bench/peers.py option given here overrides the default (the last value wins).
"""

from __future__ import annotations

import datetime
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers

RESULTS = os.path.join(peers.HERE, "results")

DEFAULTS = [
    "--peers",
    "nginx,turbo,kura",
    "--ref",
    "nginx",
    "--subject",
    "kura",
    "--get-sizes",
    "1K,64K,1M,64M",
    "--put-sizes",
    "1K,1M,64M",
    "--big",
    "1G",
    "--repeat",
    "3",
    "--duration",
    "10",
]


def main() -> None:
    args = sys.argv[1:]
    if "-h" in args or "--help" in args:
        print(__doc__)
        peers.build_parser().print_help()
        return
    out = []
    if "--table-from" not in args:
        if "--json-out" not in args:
            os.makedirs(RESULTS, exist_ok=True)
            stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
            base = os.path.join(RESULTS, stamp + ("-quick" if "--quick" in args else ""))
            base = os.path.relpath(base)  # the command line in the results names no machine path
            out = ["--json-out", base + ".jsonl", "--md-out", base + ".md"]
            peers.log(f"results: {base}.jsonl, {base}.md")
        return peers.main([*DEFAULTS, *out, *args])
    peers.main(["--subject", "kura", *args])


if __name__ == "__main__":
    main()
