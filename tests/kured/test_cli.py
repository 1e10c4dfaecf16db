"""The ``kured`` command line as a user runs it: the FleetLock server, configuration errors,
and the circuit breaker that stops a reboot loop."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from datetime import time as dtime
from pathlib import Path
from zoneinfo import ZoneInfo

import httpx

from kit.wait import wait_until
from kura_harness.launch.node import spawn_kured
from kura_harness.launch.process import free_port, stop
from kured.settings import Settings
from tests import oneshot
from tests.kured.agents import Host, read_events


def test_kured_fleetlock_serves_zincati_over_real_http(
    etcd: str, fleetlock_prefix: str, tmp_path: Path
) -> None:
    port = free_port()
    proc, _ = spawn_kured(
        [
            "fleetlock",
            "--port",
            str(port),
            "--etcd-endpoints",
            etcd,
            "--prefix",
            fleetlock_prefix,
            "--default-slots",
            "1",
            "--group-slots",
            "workers=2",
        ],
        tmp_path / "fleetlock.log",
    )
    try:
        url = f"http://127.0.0.1:{port}"
        hdr = {"fleet-lock-protocol": "true"}

        def lock(client_id: str, group: str, path: str = "pre-reboot") -> httpx.Response:
            body = {"client_params": {"id": client_id, "group": group}}
            return oneshot.post(f"{url}/v1/{path}", json=body, headers=hdr, timeout=10)

        assert lock("c1", "default").status_code == 200
        assert lock("c1", "default").status_code == 200  # idempotent
        full = lock("c2", "default")
        assert full.status_code == 409
        assert full.json()["kind"] == "failed_lock_semaphore_full"
        assert "c1" in full.json()["value"]
        assert lock("w1", "workers").status_code == 200
        assert lock("w2", "workers").status_code == 200
        assert lock("c1", "default", "steady-state").status_code == 200
        assert lock("c2", "default").status_code == 200
        missing = oneshot.post(
            f"{url}/v1/pre-reboot", json={"client_params": {"id": "c3", "group": "default"}}
        )
        assert missing.status_code == 400
        assert missing.json()["kind"] == "missing_protocol_header"
    finally:
        stop(proc, timeout=10)


def test_invalid_flags_are_all_listed_and_exit_2(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "kured.cli",
            "--period",
            "soon",
            "--concurrency",
            "0",
            "--reboot-days",
            "funday",
            "--start-time",
            "5:00pm",
            "--time-zone",
            "Mars/Olympus",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert out.returncode == 2
    for needle in (
        "node-id",
        "--period",
        "--concurrency",
        "--reboot-days",
        "--start-time",
        "--time-zone",
    ):
        assert needle in out.stderr, (needle, out.stderr)


def test_a_window_duration_past_a_year_exits_2_instead_of_crash_looping() -> None:
    # Before: the agent started, then every contains() raised OverflowError.
    out = subprocess.run(
        [sys.executable, "-m", "kured.cli", "--node-id", "n1", "--window-cron", "0 3 * * *",
         "--window-duration", "10000h"],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert "--window-duration is 36000000s, more than 366 days" in out.stderr
    assert "Traceback" not in out.stderr


STUCK_REBOOT = """#!/bin/sh
# A reboot after which the sentinel is still there (a package that keeps asking).
echo "$(date +%s.%N) $1 reboot" >> "$2"
cat /proc/sys/kernel/random/uuid > "$3"
kill -9 $PPID
"""


def test_a_node_that_keeps_needing_a_reboot_trips_the_breaker_instead_of_looping(
    etcd: str, lock_key: str, tmp_path: Path
) -> None:
    events = tmp_path / "events.log"
    script = tmp_path / "stuck.sh"
    script.write_text(STUCK_REBOOT)
    script.chmod(0o755)
    host = Host(
        tmp_path,
        "n0",
        etcd,
        events,
        "--period",
        "1s",
        "--max-consecutive-reboots",
        "2",
        "--min-reboot-interval",
        "0",  # the breaker alone (the interval would hold the second attempt off for a day)
        lock_key=lock_key,
    )
    host.argv[host.argv.index("--reboot-command") + 1] = f"{script} n0 {events} {host.boot_id}"
    host.sentinel.touch()
    try:
        host.start()

        def reboots() -> int:
            return sum(1 for e in read_events(events) if e[2] == "reboot")

        assert wait_until(lambda: host.boots >= 3, 60, interval=0.2), host.log()[-2000:]
        wait_until(
            lambda: host.status()["reason"] == "breaker_open",
            30,
            interval=0.2,
            ignoring=(httpx.HTTPError,),
        )
        status = host.status()
        assert status["reason"] == "breaker_open", status
        count = reboots()
        # It stays stopped: two more checks (its own decisions, one --period apart) say so.
        first = float(status["last_tick_at"])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and float(host.status()["last_tick_at"]) < first + 1.5:
            time.sleep(0.2)
        status = host.status()
        assert float(status["last_tick_at"]) >= first + 1.5, status
        assert status["reason"] == "breaker_open", status
        assert reboots() == count == 2
        metrics = oneshot.get(host.url + "/metrics").text
        assert re.search(r'kured_circuit_breaker_open\{node="n0"\} 1\.0', metrics)
        assert "circuit breaker open" in str(status["blocked_by"])
    finally:
        host.stop()


def test_fleetlock_help_says_when_etcd_endpoints_is_needed() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "kured.cli", "fleetlock", "--help"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    help_text = " ".join(out.stdout.split())
    assert "give it whenever etcd is not on 127.0.0.1:2379" in help_text, out.stdout


def test_real_reboot_warning_names_root_with_the_default_command_or_signal() -> None:
    from kured.cli import real_reboot_warning
    from kured.settings import load_settings

    def settings(*argv: str) -> Settings:
        import argparse

        from kured.settings import add_arguments

        parser = argparse.ArgumentParser()
        add_arguments(parser)
        return load_settings(parser.parse_args(["--node-id", "n1", *argv]), {})

    default = settings()
    warning = real_reboot_warning(default, 0)
    assert warning is not None
    assert "/bin/systemctl reboot" in warning
    assert "REALLY REBOOTS THIS MACHINE" in warning
    assert real_reboot_warning(default, 1000) is None
    assert real_reboot_warning(settings("--reboot-command", "/bin/echo reboot"), 0) is None
    signal_warning = real_reboot_warning(settings("--reboot-method", "signal"), 0)
    assert signal_warning is not None
    assert "signal 39 to PID 1" in signal_warning


def test_agent_logs_the_real_reboot_warning_at_start_up(tmp_path: Path) -> None:
    # No sentinel file and no reachable etcd: this agent can never reboot anything.
    boot_id = tmp_path / "boot_id"
    boot_id.write_text("00000000-0000-0000-0000-000000000001\n")
    stderr = tmp_path / "kured.log"
    proc, _ = spawn_kured(
        ["--node-id", "n1",
         "--etcd-endpoints", "http://127.0.0.1:1",
         "--reboot-sentinel", str(tmp_path / "never-created"),
         "--boot-id-file", str(boot_id), "--state-dir", str(tmp_path / "state"),
         "--metrics-port", "0", "--metrics-host", "127.0.0.1"],
        stderr,
    )  # fmt: skip
    stop(proc, timeout=30)
    log = stderr.read_text()
    warned = "REALLY REBOOTS THIS MACHINE" in log
    assert warned == (os.geteuid() == 0), log


def test_log_format_json_writes_one_json_object_per_line(tmp_path: Path) -> None:
    """``--log-format json``: every line on stderr is a JSON object with the time (RFC 3339
    UTC), level, logger and message (it was accepted and ignored: text lines)."""
    boot_id = tmp_path / "boot_id"
    boot_id.write_text("00000000-0000-0000-0000-000000000001\n")
    sentinel = tmp_path / "reboot-required"
    sentinel.touch()  # a reboot is wanted: the agent reads the lock, which cannot be read
    stderr = tmp_path / "kured.log"
    proc, _ = spawn_kured(
        ["--node-id", "n1", "--log-format", "json",
         "--etcd-endpoints", "http://127.0.0.1:1", "--reboot-command", "/bin/true",
         "--reboot-sentinel", str(sentinel),
         "--boot-id-file", str(boot_id), "--state-dir", str(tmp_path / "state"),
         "--metrics-port", "0", "--metrics-host", "127.0.0.1"],
        stderr,
    )  # fmt: skip
    try:
        assert wait_until(lambda: "cannot read the lock" in stderr.read_text(), 30), (
            stderr.read_text()
        )
    finally:
        assert stop(proc, timeout=30) == 0
    lines = [json.loads(line) for line in stderr.read_text().splitlines()]
    assert {tuple(sorted(line)) for line in lines} == {("level", "logger", "message", "time")}
    assert any(line["level"] == "WARNING" and line["logger"] == "kured.loop" for line in lines), (
        lines
    )
    assert lines[-1]["message"] == "kured stopped"
    for line in lines:
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", line["time"]), line


def first_sunday_openings(after: datetime) -> tuple[datetime | None, datetime]:
    """For "the first Sunday of the month 03:00-05:00, Europe/Berlin", computed here by walking
    the calendar (no cron library, no kured code): (the opening in force at ``after`` or None,
    the start of the next one), both in UTC."""
    berlin = ZoneInfo("Europe/Berlin")
    day = after.astimezone(berlin).date() - timedelta(days=1)
    current = None
    while True:
        if day.isoweekday() == 7 and day.day <= 7:
            # 03:00 exists on every first Sunday in Berlin (its changes are on last Sundays).
            start = datetime.combine(day, dtime(3, 0), tzinfo=berlin).astimezone(UTC)
            if start <= after < start + timedelta(hours=2):
                current = start
            elif start > after:
                return current, start
        day += timedelta(days=1)


def test_kured_status_names_the_next_opening_of_a_cron_window(tmp_path: Path) -> None:
    """The must-show of issue 31 item 4: a real agent with "first Sunday of the month
    03:00-05:00, Europe/Berlin" (``--window-cron '0 3 * * sun#1' --window-duration 2h``), and
    ``kured status`` naming the next opening, checked against the calendar walked here."""
    boot_id = tmp_path / "boot_id"
    boot_id.write_text("00000000-0000-0000-0000-000000000001\n")
    stderr = tmp_path / "kured.log"
    before = datetime.now(UTC)
    proc, url = spawn_kured(
        ["--node-id", "n1",
         "--window-cron", "0 3 * * sun#1", "--window-duration", "2h",
         "--time-zone", "Europe/Berlin",
         "--etcd-endpoints", "http://127.0.0.1:1", "--reboot-command", "/bin/true",
         "--reboot-sentinel", str(tmp_path / "never-created"),
         "--boot-id-file", str(boot_id), "--state-dir", str(tmp_path / "state"),
         "--metrics-port", "0", "--metrics-host", "127.0.0.1"],
        stderr,
    )  # fmt: skip
    try:

        def window_shown() -> bool:
            status = oneshot.get(url + "/status", timeout=10).json()
            return any(c["name"] == "window" for c in status["conditions"])

        assert wait_until(window_shown, 30, interval=0.2, ignoring=(httpx.HTTPError,)), (
            stderr.read_text()
        )
        out = subprocess.run(
            [sys.executable, "-m", "kured.cli", "status", "--url", url],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        after = datetime.now(UTC)
    finally:
        stop(proc, timeout=30)
    print(out.stdout)
    line = next(x for x in out.stdout.splitlines() if x.strip()[3:].startswith("window"))
    description = (
        "cron '0 3 * * sun#1' (At 03:00 on the first Sunday of the month), each opening 2h, "
        "Europe/Berlin"
    )
    assert description in line, out.stdout
    # The agent read its clock between ``before`` and ``after``: the line is right for one of
    # them (both, unless an opening began or ended in between).
    expected = []
    for moment in (before, after):
        current, upcoming = first_sunday_openings(moment)
        if current is not None:
            expected.append(f"ok window           open ({description})")
        else:
            expected.append(
                f"-- window           closed ({description}), next opening {upcoming.isoformat()}"
            )
    assert line.strip() in expected, (line, expected)
    # And the next opening is in the next five weeks, on a Sunday, 03:00 in Berlin.
    _, upcoming = first_sunday_openings(after)
    local = upcoming.astimezone(ZoneInfo("Europe/Berlin"))
    assert (local.isoweekday(), local.day <= 7, local.time()) == (7, True, dtime(3, 0))
    assert timedelta(0) < upcoming - after <= timedelta(days=35)
