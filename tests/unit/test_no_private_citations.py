"""The project stands on its own: nothing a user's clone ships cites a path into the steering
directory that sits beside the maintainers' checkout (``STEERING``), which a clone does not have.

The search reads every file of ``SEARCHED`` (nothing excluded but ``.git`` and
``__pycache__``, whose bytecode may lag behind the sources it copies until the next import) for
that directory's name followed by a slash: facts live in the project's own docs
(``docs/reference/``) or cite their public source. A hit names the file and line.
"""

from __future__ import annotations

from pathlib import Path

from tests.conftest import ROOT

SEARCHED = ("src", "docs", "README.md", "deploy")
STEERING = "shared"  # the directory's name; with a slash after it, a path into it
NEEDLE = f"{STEERING}/".encode()


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
    (tmp_path / "docs" / "a.md").write_text(f"fine\nsee {STEERING}/reference/x.md\n")
    (tmp_path / "README.md").write_text("nothing\n")
    assert hits(tmp_path) == [f"docs/a.md:2: see {STEERING}/reference/x.md"]


def test_cited_reference_pages_exist() -> None:
    for page in ("kura-behaviour.md", "kured-behaviour.md", "clients.md"):
        assert (ROOT / "docs" / "reference" / page).is_file(), page
