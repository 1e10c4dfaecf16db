"""The suite's leaked-process guard (``tests.conftest.no_leaked_processes``) finds what it must:
a process left running in, or naming, a test's tmp_path, and nothing else."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.conftest import processes_naming


def test_a_process_running_in_the_directory_or_naming_it_is_found_until_it_ends(
    tmp_path: Path,
) -> None:
    inside = subprocess.Popen(["sleep", "30"], cwd=tmp_path / ".")
    named = subprocess.Popen(  # a shell may exec its last command: two keep it the shell
        ["sh", "-c", f"sleep 30; : {tmp_path}/hang"], cwd="/"
    )
    sibling = subprocess.Popen(["sh", "-c", f"sleep 30; : {tmp_path}0/hang"], cwd="/")
    elsewhere = subprocess.Popen(["sleep", "30"], cwd="/")
    try:
        found = processes_naming(tmp_path)
        assert inside.pid in found, found
        assert named.pid in found, found
        assert elsewhere.pid not in found
        assert sibling.pid not in found  # another test's directory that shares the prefix
    finally:
        for proc in (inside, named, sibling, elsewhere):
            proc.kill()
            proc.wait()
    assert processes_naming(tmp_path) == {}
