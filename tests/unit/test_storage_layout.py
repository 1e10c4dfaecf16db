"""The storage split holds (issue 12): every module of ``src/kura/storage/`` stays small, and
the import-linter contracts for its seams are configured (``lint-imports`` enforces them)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import kura.storage

MAX_MODULE_LINES = 400  # docs/architecture.md "Storage layout"; house style: about 400 at most
STORAGE = Path(kura.storage.__file__).parent
PYPROJECT = STORAGE.parents[2] / "pyproject.toml"


def test_no_storage_module_is_over_400_lines() -> None:
    sizes = {p.name: len(p.read_text().splitlines()) for p in STORAGE.glob("*.py")}
    assert {"service.py", "index.py", "eviction.py", "blobstore.py"} <= set(sizes)
    assert {name: n for name, n in sizes.items() if n > MAX_MODULE_LINES} == {}


def test_import_linter_keeps_the_index_private_and_apart_from_the_blob_store() -> None:
    contracts = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]["contracts"]
    by_name = {c["name"]: c for c in contracts}
    private = by_name["only kura.storage imports the SQLite index modules"]
    assert {"kura.api", "kura.mesh", "kura.app"} <= set(private["source_modules"])
    assert "kura.storage.index" in private["forbidden_modules"]
    apart = by_name["the metadata index never imports the blob store"]
    assert "kura.storage.blobs" in apart["forbidden_modules"]
    assert (
        "kura.storage.index"
        in by_name["the blob store never imports the metadata index"]["forbidden_modules"]
    )
