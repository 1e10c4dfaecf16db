"""kura_harness.launch, the process launchers the demo, the tests and bench/ share: a process that
exits or never gets ready is a LaunchError carrying its log and leaves no process behind; stop()
escalates to SIGKILL and, for a process group, takes the children down too."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kit.wait import wait_until
from kura_harness.launch import LaunchError
from kura_harness.launch.etcd import Etcd
from kura_harness.launch.process import spawn_until_line, stop
from tests.conftest import NodeProcess, stop_nodes

READY = re.compile(r"^ready (\d+)$")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is gone for our purposes once reaped or defunct.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(") ", 1)[1][0] != "Z"


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_a_process_that_exits_first_is_a_launch_error_with_its_log(tmp_path: Path) -> None:
    code = "import sys; print('bad flag --x', file=sys.stderr); sys.exit(3)"
    with pytest.raises(LaunchError, match=r"(?s)did not start \(rc=3\).*bad flag --x"):
        spawn_until_line(python(code), dict(os.environ), tmp_path / "x.log", READY, "x")


def test_a_process_that_never_gets_ready_is_killed(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    code = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(600)"
    with pytest.raises(LaunchError, match="did not start"):
        spawn_until_line(python(code), dict(os.environ), tmp_path / "x.log", READY, "x", timeout=3)
    assert not alive(int(pid_file.read_text()))


def test_the_ready_line_is_matched_and_stdout_keeps_draining(tmp_path: Path) -> None:
    # After the ready line the child writes far more than a pipe holds (64 KiB): it would block
    # for ever if nobody read stdout, and would then not exit on its own.
    code = "import os\nprint('ready', os.getpid(), flush=True)\nprint('x' * 4_000_000)\n"
    started = spawn_until_line(python(code), dict(os.environ), tmp_path / "x.log", READY, "x")
    assert int(started.match.group(1)) == started.proc.pid
    assert started.proc.wait(30) == 0


def test_stop_escalates_to_sigkill_and_takes_the_group_down(tmp_path: Path) -> None:
    child_pid = tmp_path / "child"
    code = (
        "import signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"open({str(child_pid)!r}, 'w').write(str(c.pid))\n"
        "time.sleep(600)\n"
    )
    proc = subprocess.Popen(python(code), start_new_session=True)
    assert wait_until(lambda: child_pid.exists() and child_pid.read_text() != "", 30)
    started = time.monotonic()
    assert stop(proc, signal.SIGTERM, timeout=1, group=True) == -signal.SIGKILL
    assert time.monotonic() - started < 20
    assert wait_until(lambda: not alive(int(child_pid.read_text())), 10)


def test_a_missing_binary_names_the_package_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(LaunchError, match=r"`etcd` is not on PATH: apt-get install etcd-server"):
        Etcd(tmp_path / "etcd")


def test_etcd_starts_healthy_and_stops(tmp_path: Path) -> None:
    server = Etcd(tmp_path / "etcd").start()
    try:
        assert server.healthy()
    finally:
        server.stop()
    assert server.proc is not None
    assert server.proc.returncode is not None
    assert not server.healthy()


def harness_node(tmp_path: Path, code: str, **env: str) -> NodeProcess:
    """A ``NodeProcess`` around a real Python process running ``code`` (no kura: the harness's
    own exit-code rule is under test)."""
    log = tmp_path / "harness.log"
    log.touch()
    proc = subprocess.Popen(
        python(code + "\nprint('up', flush=True)\ntime.sleep(60)"),
        text=True,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None
    with proc.stdout:  # it writes nothing more
        assert proc.stdout.readline() == "up\n"
    return NodeProcess("http://127.0.0.1:1", tmp_path, tmp_path, proc, log, env)


def test_the_harness_counts_death_by_sigterm_as_a_crash(tmp_path: Path) -> None:
    """A node handles SIGTERM and exits 0; one killed by it (no handler installed yet, as a
    node announcing its port too early was) fails ``stop_nodes``."""
    untrapped = harness_node(tmp_path, "import time")
    with pytest.raises(AssertionError, match="exited -15"):
        stop_nodes([untrapped])
    trapped = harness_node(
        tmp_path,
        "import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *_: sys.exit(0))",
    )
    assert stop_nodes([trapped]) == [0]


def test_the_harness_accepts_sigkill_only_when_the_test_sent_it(tmp_path: Path) -> None:
    code = "import time"
    killed = harness_node(tmp_path, code)
    killed.kill()
    assert killed.proc.wait(10) == -signal.SIGKILL
    assert stop_nodes([killed]) == [-signal.SIGKILL]
    by_failpoint = harness_node(tmp_path, code, KURA_FAILPOINTS="storage.after_commit=kill")
    os.kill(by_failpoint.proc.pid, signal.SIGKILL)  # as kit.failpoint's kill does
    by_failpoint.proc.wait(10)
    assert stop_nodes([by_failpoint]) == [-signal.SIGKILL]
    unexpected = harness_node(tmp_path, code)
    os.kill(unexpected.proc.pid, signal.SIGKILL)  # nobody asked for it: a crash
    unexpected.proc.wait(10)
    with pytest.raises(AssertionError, match="exited -9"):
        stop_nodes([unexpected])
