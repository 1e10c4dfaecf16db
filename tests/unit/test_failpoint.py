"""kit.failpoint: the spec is parsed strictly, and an armed point really kills the process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from kit.failpoint import parse


def test_a_spec_names_kills_and_sleeps_with_probabilities() -> None:
    actions = parse("storage.after_publish=kill@0.2, storage.after_commit=sleep(50)")
    assert actions["storage.after_publish"].kind == "kill"
    assert actions["storage.after_publish"].probability == 0.2
    assert actions["storage.after_commit"].kind == "sleep"
    assert actions["storage.after_commit"].sleep_ms == 50
    assert actions["storage.after_commit"].probability == 1.0
    assert parse("") == {}


def test_an_eio_point_passes_n_times_then_raises_on_every_pass() -> None:
    code = (
        "from kit.failpoint import failpoint\n"
        "for i in range(5):\n"
        "    try:\n"
        "        failpoint('p'); print('ok', i)\n"
        "    except OSError as e:\n"
        "        print('eio', i, e.errno)\n"
    )
    env = dict(os.environ, KURA_FAILPOINTS="p=eio(2)")
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.stdout.split("\n")[:5] == ["ok 0", "ok 1", "eio 2 5", "eio 3 5", "eio 4 5"]
    assert parse("p=eio(7)")["p"].healthy_passes == 7


@pytest.mark.parametrize(
    "spec", ["x", "x=explode", "=kill", "x=kill@2", "x=sleep(ms)", "x=eio", "x=eio(-1)"]
)
def test_a_malformed_spec_is_refused(spec: str) -> None:
    with pytest.raises(ValueError, match="KURA_FAILPOINTS"):
        parse(spec)


def _run(spec: str) -> subprocess.CompletedProcess[str]:
    code = "from kit.failpoint import failpoint; failpoint('p'); print('passed')"
    env = dict(os.environ, KURA_FAILPOINTS=spec)
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )


def test_an_armed_kill_point_sigkills_the_process_and_says_so() -> None:
    done = _run("p=kill")
    assert done.returncode == -signal.SIGKILL
    assert "failpoint p: kill" in done.stderr
    assert "passed" not in done.stdout


def test_a_point_at_probability_zero_or_unnamed_does_nothing() -> None:
    for spec in ("p=kill@0", "other=kill", ""):
        done = _run(spec)
        assert (done.returncode, done.stdout.strip()) == (0, "passed"), spec
