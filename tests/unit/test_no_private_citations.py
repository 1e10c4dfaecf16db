"""The project stands on its own: nothing a user's clone ships cites a ``shared/`` path.

The same search as ``grep -rn "shared/" src docs README.md deploy`` (every file, nothing
excluded but ``.git`` and ``__pycache__``, whose bytecode may lag behind the sources it copies
until the next import): facts live in the project's own docs (``docs/reference/``) or cite their
public source. A hit names the file and line.
"""

from __future__ import annotations

from pathlib import Path

from tests.conftest import ROOT

SEARCHED = ("src", "docs", "README.md", "deploy")
NEEDLE = b"shared/"


def hits(root: Path) -> list[str]:
    found = []
    for name in SEARCHED:
        top = root / name
        files = [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file())
        for path in files:
            if {".git", "__pycache__"} & set(path.relative_to(root).parts):
                continue
            for number, line in enumerate(path.read_bytes().splitlines(), 1):
                if NEEDLE in line:
                    text = line.decode("utf-8", "replace").strip()
                    found.append(f"{path.relative_to(root)}:{number}: {text}")
    return found


def test_no_file_the_project_ships_cites_a_shared_path() -> None:
    assert hits(ROOT) == []


def test_the_search_finds_a_citation_where_there_is_one(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("fine\nsee shared/reference/x.md\n")
    (tmp_path / "README.md").write_text("nothing\n")
    assert hits(tmp_path) == ["docs/a.md:2: see shared/reference/x.md"]


def test_cited_reference_pages_exist() -> None:
    for page in ("kura-behaviour.md", "kured-behaviour.md", "clients.md"):
        assert (ROOT / "docs" / "reference" / page).is_file(), page
