"""The previous release of kura, built from this repository's history beside HEAD, for the
version-skew tests (issue 31 item 1; ``tests/e2e/test_version_skew.py``).

``PREVIOUS_RELEASE`` is the one place that names it: the full commit of the last release on
main and the version it calls itself. **Moving it at each release**: once release X.Y.Z is
merged to main, set ``commit`` to that merge's full hash (``git rev-parse <short>``) and
``version`` to X.Y.Z (its ``kura.__version__``), in the same change that starts the next
version on HEAD; the skew tests then run that release against the new HEAD.

``build_release`` exports the commit's tree with ``git archive`` (no worktree bookkeeping) into
a directory of its own, generates its REAPI stubs with *its* ``setup.py --name`` (the stubs are
gitignored: ``setup.py``) using this interpreter, and proves what a node started there runs:
with ``PYTHONPATH=<export>/src`` first, every ``kura``, ``kit`` and ``kura_harness`` module a
``kura serve`` loads resolves under the export, not to the editable install of HEAD (whose
``.pth`` entry comes after ``PYTHONPATH`` on ``sys.path``), and reports the recorded version.

A commit missing from the clone (a shallow CI clone) is fetched once (``git fetch --depth 1
origin <commit>``); if it is still missing, ``ReleaseUnavailable`` is raised: the tests fail,
they never skip.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests import oneshot
from tests.conftest import NodeProcess


@dataclass(frozen=True)
class Pinned:
    """A release pinned by its full commit hash and the version its ``kura.__version__`` says."""

    commit: str  # 40 hex digits
    version: str


# The last release on main (kura 0.1.0): main at 2aa3d81. Move it at each release (see above).
PREVIOUS_RELEASE = Pinned("2aa3d812dee21942a52d3f5463f58778f99ce810", "0.1.0")

# Run by the export's interpreter: import what ``kura serve`` imports, then name the file of
# every module of the packages the export ships, and the version.
_PROBE = """
import json, sys
import kura, kura.app, kura.cli, kit, kura_harness
mods = {n: getattr(m, "__file__", None) for n, m in list(sys.modules.items())
        if n.split(".")[0] in ("kura", "kit", "kura_harness")}
print(json.dumps({"version": kura.__version__, "modules": mods}))
"""


class ReleaseUnavailable(RuntimeError):
    """The pinned commit is not in this clone, even after one ``git fetch``, or it cannot be
    built (its ``setup.py`` failed), or what it runs is not its own code."""


@dataclass(frozen=True)
class Release:
    """A release exported under ``root`` and runnable with this interpreter."""

    commit: str
    version: str
    root: Path

    @property
    def src(self) -> Path:
        return self.root / "src"

    @property
    def prefix(self) -> tuple[str, ...]:
        """The command prefix that runs ``python -m kura.cli serve`` (``spawn_node``'s, and
        ``Mesh``'s ``prefixes``) as this release: ``env PYTHONPATH=<root>/src``, which replaces
        any ``PYTHONPATH`` the test run has and execs the interpreter (same pid: signals reach
        the node)."""
        return ("env", f"PYTHONPATH={self.src}")


def repo_root() -> Path:
    """The repository (or worktree) holding this file: found from its location."""
    return Path(__file__).resolve().parents[2]


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, timeout=120, check=False
    )


def ensure_commit(repo: Path, commit: str) -> None:
    """Make sure ``commit`` is in ``repo``: fetch it from ``origin`` once if not. Raises
    ``ReleaseUnavailable`` naming both attempts when it is still missing."""
    if _git(repo, "cat-file", "-e", f"{commit}^{{commit}}").returncode == 0:
        return
    fetched = _git(repo, "fetch", "--depth", "1", "origin", commit)
    if _git(repo, "cat-file", "-e", f"{commit}^{{commit}}").returncode == 0:
        return
    raise ReleaseUnavailable(
        f"the previous release {commit} is not in the clone at {repo} and "
        f"`git fetch --depth 1 origin {commit}` did not bring it (rc={fetched.returncode}: "
        f"{fetched.stderr.decode(errors='replace').strip()}); fetch it (or unshallow the "
        "clone) and run again"
    )


def build_release(pinned: Pinned, dest: Path, repo: Path | None = None) -> Release:
    """Export ``pinned.commit`` of ``repo`` (default ``repo_root()``) into the empty directory
    ``dest``, generate its REAPI stubs, and prove what it runs (``probe``). Raises
    ``ReleaseUnavailable``."""
    repo = repo or repo_root()
    ensure_commit(repo, pinned.commit)
    dest.mkdir(parents=True, exist_ok=True)
    archive = _git(repo, "archive", "--format=tar", pinned.commit)
    if archive.returncode != 0:
        raise ReleaseUnavailable(f"git archive {pinned.commit}: {archive.stderr!r}")
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True, timeout=120)
    stubs = subprocess.run(
        [sys.executable, "setup.py", "--name"],
        cwd=dest,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if stubs.returncode != 0:
        raise ReleaseUnavailable(
            f"{pinned.commit}'s setup.py --name failed ({stubs.returncode}):\n{stubs.stderr}"
        )
    release = Release(pinned.commit, pinned.version, dest)
    probe(release)
    return release


def probe(release: Release) -> dict[str, str]:
    """Run ``_PROBE`` under ``release.prefix`` (the environment its nodes get) and check that
    every loaded ``kura``/``kit``/``kura_harness`` module is a file under ``release.src`` and
    that ``kura.__version__`` is ``release.version``. Returns ``{module: file}``; raises
    ``ReleaseUnavailable`` naming the first module found elsewhere."""
    done = subprocess.run(
        [*release.prefix, sys.executable, "-c", _PROBE],
        cwd=release.root.parent,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        raise ReleaseUnavailable(f"the probe of {release.root} failed:\n{done.stderr}")
    found = json.loads(done.stdout)
    modules: dict[str, str] = {}
    for name, file in found["modules"].items():
        if file is None:  # a namespace package has no file: none of ours is one
            raise ReleaseUnavailable(f"{name} has no __file__ under {release.prefix}")
        if not Path(file).resolve().is_relative_to(release.src.resolve()):
            raise ReleaseUnavailable(
                f"{name} loads from {file}, not from the export {release.src}: HEAD shadows "
                "the previous release"
            )
        modules[name] = file
    if found["version"] != release.version:
        raise ReleaseUnavailable(
            f"{release.commit} says kura {found['version']}, recorded as {release.version}: "
            "move PREVIOUS_RELEASE (tests/e2e/previous.py)"
        )
    return modules


def node_status(node: NodeProcess) -> dict[str, object]:
    """``GET /status`` of ``node`` (public port, no token), parsed. Raises
    ``httpx.HTTPStatusError`` on a refusal."""
    resp = oneshot.get(node.url + "/status", timeout=10)
    return resp.raise_for_status().json()  # type: ignore[no-any-return]


def statuses(nodes: list[NodeProcess]) -> list[dict[str, object]]:
    """``node_status`` of each node, in order: the one place the skew tests read ``/status``
    (per-node version checks go here)."""
    return [node_status(node) for node in nodes]


def versions(nodes: list[NodeProcess]) -> list[str]:
    """The ``version`` each node reports in ``/status``, in order."""
    return [str(s["version"]) for s in statuses(nodes)]


__all__ = [
    "PREVIOUS_RELEASE",
    "Pinned",
    "Release",
    "ReleaseUnavailable",
    "build_release",
    "node_status",
    "probe",
    "statuses",
    "versions",
]
