"""bench/key_curve.py end to end at 100 keys, kura's bodies as files and inline: real kura (with and without its hot cache), nginx and
turborepo-remote-cache on one seeded data dir, wrk load, every case's bodies checked.

It keeps the benchmark from rotting: a missing wrk, nginx, node or turborepo-remote-cache
(``scripts/install-deps``) fails it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

SCRIPT = ROOT / "bench" / "key_curve.py"
SERVERS = {"kura", "kura-nohot", "nginx", "turbo"}


@pytest.mark.parametrize("bodies", ["files", "inline"])
def test_key_curve_smoke(tmp_path: Path, bodies: str) -> None:
    out = tmp_path / "curve.jsonl"
    md = tmp_path / "curve.md"
    work = tmp_path / "work"
    args = ["--counts", "100", "--repeat", "1", "--duration", "1", "--root", str(work)]
    args += ["--inline"] if bodies == "inline" else []
    run = subprocess.run(
        [sys.executable, str(SCRIPT), *args, "--json-out", str(out), "--md-out", str(md)],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    cases = {r["server"]: r for r in rows if r["kind"] == "case"}
    assert set(cases) == SERVERS
    for name, r in cases.items():
        assert r["keys"] == 100, name
        assert r["requests"] > 0, r
        assert r["errors"] == 0, r
        assert r["ok"], r
        assert (r["bodies_checked"], r["bodies_wrong"]) == (100, 0), r
        assert 0 < r["p50_ms"] <= r["p99_ms"], r
        assert r["load1"] >= 0
    # 100 keys fit the default hot cache; with KURA_HOT_CACHE_BYTES=0 no lookup is a hit.
    assert cases["kura"]["hot_cache_hit_ratio"] > 0.5
    assert cases["kura-nohot"]["hot_cache_hit_ratio"] == 0
    servers = {r["server"]: r for r in rows if r["kind"] == "server"}
    assert set(servers) == SERVERS
    for name, s in servers.items():
        assert 0 < s["rss_start_mib"] <= s["rss_peak_mib"], (name, s)
    assert servers["kura"]["data_mib"] > 0
    assert servers["kura"]["kura_bodies"] == bodies
    assert list(work.iterdir()) == [], "the count's data dirs are removed after the run"
    table = md.read_text()
    for name in SERVERS:
        assert f"| 100 | {name} ({bodies}) |" in table or f"| 100 | {name} |" in table
    # The table rebuilds from the JSON lines alone.
    again = subprocess.run(
        [sys.executable, str(SCRIPT), "--table-from", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert again.stdout == table
