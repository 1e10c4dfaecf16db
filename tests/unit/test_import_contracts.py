"""The import-linter contracts (``[tool.importlinter]`` in pyproject.toml) hold on ``src/``, and
each one breaks when violated (issue 27 item 4: every module in a layer, enforced).

``lint-imports`` (the real tool) runs twice, at the same time: on ``src/`` as it is, where every
contract must be kept, and on a copy of ``src/`` into which ``VIOLATIONS`` writes, for every
contract, modules (or lines appended to existing ones) that break it. Each contract must then be
reported broken, and its own section of the report must name the import written to break it, so
a contract broken only by another contract's violation does not pass. A contract added to
pyproject.toml without a violation here fails ``test_every_contract_has_a_violation``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = ROOT / "pyproject.toml"
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


@dataclass(frozen=True)
class Breach:
    """``code`` written to ``path`` (under src/; appended when the module exists), and the text
    lint-imports must print in the contract's section: the offending import or module."""

    path: str
    code: str
    reported: str


VIOLATIONS: Mapping[str, tuple[Breach, ...]] = {
    "kura layers: entry -> cli -> app -> workers -> grpc -> api -> mesh -> storage -> core": (
        Breach(
            "kura/storage/violation_up.py",
            "import kura.mesh.wire",
            "kura.storage.violation_up -> kura.mesh.wire",
        ),
        Breach("kura/violation_unlayered.py", '"""In no layer."""', "- kura.violation_unlayered"),
    ),
    "kura_harness layers: the dev mesh -> the rolling demo -> the process launchers": (
        Breach(
            "kura_harness/launch/violation_up.py",
            "import kura_harness.rolling.config",
            "kura_harness.launch.violation_up -> kura_harness.rolling.config",
        ),
        Breach(
            "kura_harness/violation_unlayered.py",
            '"""In no layer."""',
            "- kura_harness.violation_unlayered",
        ),
    ),
    "the harness starts kura and kured as processes and imports neither": (
        Breach(
            "kura_harness/rolling/violation_node.py",
            "import kura.app",
            "kura_harness.rolling.violation_node -> kura.app",
        ),
    ),
    "kured layers": (
        Breach(
            "kured/locks/violation_up.py",
            "import kured.loop",
            "kured.locks.violation_up -> kured.loop",
        ),
        Breach("kured/violation_unlayered.py", '"""In no layer."""', "- kured.violation_unlayered"),
    ),
    "kit layers: its modules are independent of each other (settings reads service links; any may take a clock)": (
        Breach("kit/backoff.py", "import kit.pace", "kit.backoff -> kit.pace"),
        Breach("kit/violation_unlayered.py", '"""In no layer."""', "- kit.violation_unlayered"),
    ),
    "the package roots (kura, kured, kit: a docstring and a version) import none of their modules": (
        Breach("kured/__init__.py", "import kured.core.errors", "kured -> kured.core.errors"),
    ),
    "kura and kured never import each other": (
        Breach("kura/console.py", "import kured.core.errors", "kura.console -> kured.core.errors"),
    ),
    "kit is domain-free": (
        Breach("kit/pace.py", "import kura.core.errors", "kit.pace -> kura.core.errors"),
    ),
    "kura core does no IO: no os, time, threading, asyncio, SQLite, HTTP, metrics or kit": tuple(
        Breach(f"kura/core/violation_{m}.py", f"import {m}", f"kura.core.violation_{m} -> {m}")
        for m in ("os", "time", "threading", "asyncio")
    ),
    "kured core does no IO: no os, time, threading, asyncio, subprocess, HTTP, Kubernetes or kit": tuple(
        Breach(f"kured/core/violation_{m}.py", f"import {m}", f"kured.core.violation_{m} -> {m}")
        for m in ("os", "time", "threading", "asyncio")
    ),
    "only kura.storage imports its SQL modules (every module that runs SQL)": (
        Breach(
            "kura/mesh/violation_sql.py",
            "from kura.storage import paging",
            "kura.mesh.violation_sql -> kura.storage.paging",
        ),
        Breach(
            "kura/api/violation_sql.py",
            "import kura.storage.index",
            "kura.api.violation_sql -> kura.storage.index",
        ),
    ),
    "the layers above storage (api, grpc, mesh, workers) type against its ports, never the concrete store": tuple(
        Breach(
            f"kura/{layer}/violation_store.py",
            "from kura.storage.service import CacheService",
            f"kura.{layer}.violation_store -> kura.storage.service",
        )
        for layer in ("api", "grpc", "mesh", "workers")
    ),
    "only storage touches SQLite": (
        Breach(
            "kura/api/violation_sqlite.py", "import sqlite3", "kura.api.violation_sqlite -> sqlite3"
        ),
    ),
    "only storage talks to the object store (obstore; the demo's bucket harness aside)": (
        Breach(
            "kura/mesh/violation_obstore.py",
            "import obstore",
            "kura.mesh.violation_obstore -> obstore",
        ),
    ),
    "the metadata index never imports the blob store": (
        Breach(
            "kura/storage/digests.py",
            "import kura.storage.blobs",
            "kura.storage.digests -> kura.storage.blobs",
        ),
    ),
    "the blob store never imports the metadata index": (
        Breach(
            "kura/storage/blobstore.py",
            "import kura.storage.schema",
            "kura.storage.blobstore -> kura.storage.schema",
        ),
    ),
    "the serving process (every module of kura but its cli) never loads the demo or the dev-mesh harness": (
        Breach("kura/app.py", "import kura_harness.rolling", "kura.app -> kura_harness.rolling"),
        Breach(
            "kura/storage/violation_demo.py",
            "import kura_harness.launch",
            "kura.storage.violation_demo -> kura_harness.launch",
        ),
        Breach(
            "kura/workers/violation_dev.py",
            "import kura_harness.devmesh",
            "kura.workers.violation_dev -> kura_harness.devmesh",
        ),
    ),
    "a worker process loads neither the primary's composition root, nor gRPC, nor the object store (each process's RSS counts toward the node's)": (
        Breach("kura/workers/worker.py", "import grpc", "kura.workers.worker -> grpc"),
    ),
    "the process launchers (shared by the demo, the tests and bench/) are standard library only": (
        Breach(
            "kura_harness/launch/violation_http.py",
            "import aiohttp",
            "kura_harness.launch.violation_http -> aiohttp",
        ),
    ),
    "kured settings parsing takes the silence matchers from kured.core, not the Alertmanager "
    "client": (
        Breach(
            "kured/settings_rules.py",
            "\nimport kured.actuators.silence\nimport aiohttp\n",
            "kured.settings_rules -> kured.actuators.silence",
        ),
        Breach("kured/settings_rules.py", "", "kured.settings_rules -> aiohttp"),
    ),
    "only kured.apiserver imports the Kubernetes client": (
        Breach(
            "kured/locks/violation_kube.py",
            "import kubernetes",
            "kured.locks.violation_kube -> kubernetes",
        ),
    ),
}


def contract_names() -> list[str]:
    config = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]
    return [c["name"] for c in config["contracts"]]


def lint_imports(src: Path, workdir: Path) -> subprocess.CompletedProcess[str]:
    """The real ``lint-imports`` over ``src`` with this checkout's contracts (no cache; wide
    lines, so no contract name is wrapped)."""
    env = {**os.environ, "PYTHONPATH": str(src), "COLUMNS": "1000", "NO_COLOR": "1"}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo", str(PYPROJECT)],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def broken_sections(report: str, names: list[str]) -> dict[str, str]:
    """Each broken contract's section of the report's "Broken contracts" part, by name."""
    _, _, broken = report.partition("Broken contracts\n----------------\n")
    starts = sorted((i, n) for n in names if (i := broken.find(f"\n{n}\n")) >= 0)
    ends = [i for i, _ in starts[1:]] + [len(broken)]
    return {n: broken[i:end] for (i, n), end in zip(starts, ends, strict=True)}


@dataclass(frozen=True)
class Runs:
    clean: subprocess.CompletedProcess[str]
    violated: subprocess.CompletedProcess[str]
    sections: dict[str, str]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    work = tmp_path_factory.mktemp("contracts")
    copy = work / "src"
    shutil.copytree(ROOT / "src", copy, ignore=shutil.ignore_patterns("__pycache__"))
    for breaches in VIOLATIONS.values():
        for b in breaches:
            target = copy / b.path
            before = target.read_text() if target.exists() else ""
            target.write_text(f"{before}\n{b.code}\n")
    with ThreadPoolExecutor(2) as pool:
        clean = pool.submit(lint_imports, ROOT / "src", work)
        violated = pool.submit(lint_imports, copy, work)
        return Runs(
            clean.result(),
            violated.result(),
            broken_sections(violated.result().stdout, contract_names()),
        )


def test_every_contract_has_a_violation() -> None:
    assert sorted(contract_names()) == sorted(VIOLATIONS)


def test_the_sql_contract_lists_every_storage_module_that_runs_sql() -> None:
    """ "The SQL modules are forbidden outside storage" means all of them: a storage module that
    runs a statement (``execute``, ``executemany``, ``executescript``) is in the contract."""
    config = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]
    (sql,) = [c for c in config["contracts"] if c["name"].startswith("only kura.storage imports")]
    storage = ROOT / "src" / "kura" / "storage"
    runs_sql = {
        "kura.storage." + p.stem
        for p in storage.glob("*.py")
        if re.search(r"\.execute(many|script)?\(", p.read_text())
    }
    assert "kura.storage.index" in runs_sql
    assert sorted(runs_sql - set(sql["forbidden_modules"])) == []


def test_lint_imports_keeps_every_contract_on_src(runs: Runs) -> None:
    assert runs.clean.returncode == 0, runs.clean.stdout + runs.clean.stderr
    assert f"Contracts: {len(VIOLATIONS)} kept, 0 broken." in runs.clean.stdout


@pytest.mark.parametrize("name", list(VIOLATIONS))
def test_the_contract_breaks_when_violated(runs: Runs, name: str) -> None:
    assert runs.violated.returncode == 1, runs.violated.stdout + runs.violated.stderr
    assert name in runs.sections, f"{name!r} kept despite {VIOLATIONS[name]}"
    section = runs.sections[name]
    missed = [b.reported for b in VIOLATIONS[name] if b.reported not in section]
    assert missed == [], section


def test_the_serve_path_loads_neither_the_demo_nor_the_dev_mesh() -> None:
    """What ``kura serve`` imports (the CLI, the primary's composition root, a worker): the CLI
    imports the demo and the dev mesh inside their own subcommands only, which lint-imports
    (reading every import statement) cannot tell apart from a module-level import."""
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, kura.cli, kura.app, kura.workers.worker; "
            "print(sorted(m for m in sys.modules if m.startswith('kura_harness')))",
        ],
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert loaded.stdout.strip() == "[]"
