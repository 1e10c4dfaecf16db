"""``kured doctor`` as a command: the ``--json`` shape, one text line per finding, exit codes
(0 no FAIL, 1 a FAIL, 2 invalid flags), ``--help``, the sentinel command's exit statuses (run for
real) and the lock settings that are risky for a 3-member etcd."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kit.settings import parse_duration
from kured.doctor.host import check_sentinel
from kured.doctor.lock import check_lock
from kured.settings import Settings, add_arguments, load_settings
from tests.kured.doctor_host import doctor, good_apt, in_process, release

__all__ = ["good_apt", "release"]
pytestmark = pytest.mark.usefixtures("good_apt")


def only(report: dict[str, Any], check: str) -> list[tuple[str, str]]:
    return [(f["level"], f["message"]) for f in report["findings"] if f["check"] == check]


def test_json_shape_and_exit_code_zero_with_warnings_only(
    good_apt: Path, release: str, etcd: str
) -> None:
    code, report = doctor("--kernel-release", release, apt_config=good_apt, etcd=etcd)
    assert code == 0
    assert set(report) == {"ok", "exit_code", "findings", "skipped"}
    assert report["ok"] is True
    assert report["exit_code"] == 0
    for finding in report["findings"]:
        assert set(finding) == {"level", "check", "message", "fix"}
        assert finding["level"] in ("OK", "WARN", "FAIL")
        assert bool(finding["fix"]) == (finding["level"] != "OK"), finding
    assert [f["check"] for f in report["findings"]][:4] == ["sentinel", "apt", "apt", "kernel"]
    assert {"OK", "WARN"} == {f["level"] for f in report["findings"] if f["check"] == "lock"}
    assert {s["check"] for s in report["skipped"]} == {"pdb", "gate", "prometheus"}
    for skipped in report["skipped"]:
        assert set(skipped) == {"check", "reason"}


def test_text_has_one_line_per_finding_and_exit_one_on_fail(release: str, etcd: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KURED_")}
    env["KURED_ETCD_ENDPOINTS"] = etcd
    env["KURED_LOCK_TTL"] = "5m"  # shorter than a reboot: FAIL (and the environment is read)
    proc = subprocess.run(
        [sys.executable, "-m", "kured.cli", "doctor", "--kernel-release", release],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[-1].startswith("1 FAIL, "), lines
    body = [line for line in lines[:-1] if not line.startswith("SKIP")]
    assert all(line.split()[0] in ("OK", "WARN", "FAIL") for line in body), lines
    [lock] = [line for line in body if line.startswith("FAIL")]
    assert lock.startswith("FAIL  lock       --lock-ttl 5m is shorter than a reboot (")
    assert " Fix: set --lock-ttl above 10m" in lock


def test_invalid_flags_exit_two_with_every_problem(capsys: pytest.CaptureFixture[str]) -> None:
    from kured.doctor.command import main

    code = main(["--json", "--node-id", "n", "--period", "0"], environ={"KURED_CONCURRENCY": "0"})
    report = json.loads(capsys.readouterr().out)
    assert code == 2
    assert report["exit_code"] == 2
    assert report["ok"] is False
    problems = [f["message"] for f in report["findings"]]
    assert all(f["check"] == "config" for f in report["findings"])
    assert any("--period" in p for p in problems), problems
    assert any("KURED_CONCURRENCY" in p for p in problems), problems


def test_an_unreachable_prometheus_fails_because_the_gate_is_fail_closed(
    capsys: pytest.CaptureFixture[str], release: str
) -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    code, report = in_process(capsys, release, "--prometheus-url", url, "--node-count", "3")
    [(level, message)] = only(report, "alerts")
    assert level == "FAIL"
    assert message.startswith(f"Prometheus at {url} unreachable: connection refused: the agent's")
    assert code == 1


def test_help_lists_the_doctor_flags() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "kured.cli", "doctor", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0
    for flag in ("--node-count", "--reboot-duration", "--kernel-release", "--host-root",
                 "--json", "--prometheus-url", "--kubeconfig", "--alert-filter-regexp"):  # fmt: skip
        assert flag in proc.stdout, flag
    help_text = " ".join(proc.stdout.split())
    # The doctor defaults --node-id to the host name; only the agent requires it.
    assert "--node-id VALUE this node's name (default: this host's name)" in help_text
    assert "(required)" not in help_text
    agent = subprocess.run(
        [sys.executable, "-m", "kured.cli", "--help"], capture_output=True, text=True, timeout=60
    )
    assert "kured doctor --help" in " ".join(agent.stdout.split())


@pytest.mark.parametrize(
    ("command", "level", "start"),
    [
        ("true", "OK", "sentinel command true runs and exits 0: a reboot is needed now"),
        ("sh -c 'exit 1'", "OK", "sentinel command sh -c 'exit 1' runs and exits 1"),
        ("sh -c 'exit 3'", "WARN", "sentinel command sh -c 'exit 3' exits 3: kured reads"),
        ("sh -c 'exit 127'", "FAIL", "sentinel command 'sh -c exit 127' exited 127 (cannot run)"),
        ("/nonexistent/needs-restarting", "FAIL", "sentinel command '/nonexistent/needs-restarting' could not start"),
    ],
    ids=["exit-0", "exit-1", "exit-3", "exit-127", "missing"],
)  # fmt: skip
def test_the_sentinel_command_must_exit_zero_or_one(command: str, level: str, start: str) -> None:
    s = settings("--reboot-sentinel-command", command)
    [finding] = asyncio.run(check_sentinel(s, Path("/"), "6.1.0-1-amd64"))
    assert finding.level == level, finding
    assert finding.message.startswith(start), finding


@pytest.mark.parametrize(
    ("args", "reboot_seconds", "expected"),
    [
        (["--lock-ttl", "30m", "--drain-timeout", "15m", "--lock-release-delay", "10m"], 600.0,
         ("FAIL", "--lock-ttl 30m is shorter than a reboot (--drain-delay 0 + --drain-timeout "
                  "15m + --reboot-delay 0 + --reboot-duration 10m + --lock-release-delay 10m "
                  "= 35m)")),
        (["--lock-ttl", "2h", "--drain-timeout", "15m", "--lock-release-delay", "10m"], 600.0,
         ("OK", "--lock-ttl 2h outlasts a reboot (")),
        (["--lock-ttl", "2h"], 600.0, ("WARN", "--lock-ttl 2h with --drain-timeout 0: a drain")),
        (["--lock-ttl", "20m", "--drain-timeout", "1m"], 1500.0,
         ("FAIL", "--lock-ttl 20m is shorter than a reboot")),
        (["--concurrency", "2"], 600.0, ("WARN", "--concurrency 2: two control-plane nodes")),
    ],
    ids=["ttl-short", "ttl-ok", "no-drain-timeout", "slow-reboot", "concurrency"],
)  # fmt: skip
def test_lock_settings_risky_for_a_three_member_etcd(
    args: list[str], reboot_seconds: float, expected: tuple[str, str]
) -> None:
    multi = ["--etcd-endpoints", "http://e1:2379,http://e2:2379,http://e3:2379"]
    lock = check_lock(settings(*multi, "--lock-release-delay", "5m", *args), reboot_seconds)
    level, start = expected
    assert any(f.level == level and f.message.startswith(start) for f in lock), lock
    assert not any(f.message.startswith("--etcd-endpoints names one") for f in lock), lock
    one = check_lock(settings("--lock-release-delay", "5m"), reboot_seconds)
    assert any(f.message.startswith("--etcd-endpoints names one member") for f in one), one


def settings(*args: str) -> Settings:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return load_settings(parser.parse_args(["--node-id", "n1", *args]), {})


DOC = Path(__file__).resolve().parents[2] / "docs" / "kured.md"
DOCTOR_ROW = re.compile(r"^\| `(--[a-z0-9-]+)` \| `([^`]*)` \| (.+) \|$")


def test_the_doctor_flag_table_matches_the_parser() -> None:
    from kured.doctor.command import DOCTOR_FLAGS, parser

    section = DOC.read_text().split("## `kured doctor`", 1)[1].split("\n## ", 1)[0]
    rows = [m.groups() for line in section.splitlines() if (m := DOCTOR_ROW.match(line))]
    assert [flag for flag, _, _ in rows] == list(DOCTOR_FLAGS)
    actions = {a.option_strings[0]: a for a in parser()._actions if a.option_strings}
    for flag, cell, _ in rows:
        default = actions[flag].default
        if default is None:
            assert cell == "(unset)", flag
        elif isinstance(default, bool):
            assert cell == str(default).lower(), flag
        elif isinstance(default, float):
            assert parse_duration(cell) == default, flag
        else:
            assert cell == str(default), flag
