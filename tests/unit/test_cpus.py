"""``kit.cpus``: the CPU count ``KURA_WORKERS=auto`` sizes itself by."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kit import cpus


def test_an_affinity_mask_of_one_cpu_gives_one() -> None:
    code = "from kit.cpus import available_cpus; print(available_cpus())"
    out = subprocess.run(
        ["taskset", "-c", "0", sys.executable, "-c", code], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "1"


def test_without_a_mask_or_quota_it_is_the_affinity_count() -> None:
    assert 1 <= cpus.available_cpus() <= len(os.sched_getaffinity(0))


def cgroup_tree(root: Path, quotas: dict[str, str]) -> Path:
    """``root/a/b`` with ``cpu.max`` files as given (relative path -> contents)."""
    leaf = root / "a" / "b"
    leaf.mkdir(parents=True)
    for rel, text in quotas.items():
        (root / rel / "cpu.max").write_text(text)
    return leaf


def test_the_tightest_quota_up_the_tree_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cpus, "CGROUP_ROOT", tmp_path)
    leaf = cgroup_tree(tmp_path, {"a": "150000 100000\n", "a/b": "max 100000\n"})
    assert cpus.quota_cpus(leaf) == 1.5


def test_no_quota_anywhere_is_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpus, "CGROUP_ROOT", tmp_path)
    leaf = cgroup_tree(tmp_path, {"a/b": "max 100000\n"})
    assert cpus.quota_cpus(leaf) is None
