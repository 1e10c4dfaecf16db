"""Sentinels and the alert filter (kured-behaviour.md §2.6-2.7; field report B39)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kured.core.errors import SensorError
from kured.sensors.alerts import active_alerts
from kured.sensors.sentinel import (
    AnySentinel,
    CommandSentinel,
    FileSentinel,
    KernelSentinel,
    kernel_version_key,
)


async def test_file_sentinel_follows_the_file(tmp_path: Path) -> None:
    path = tmp_path / "reboot-required"
    assert (await FileSentinel(path).check())[0] is False
    path.touch()
    assert (await FileSentinel(path).check())[0] is True


async def test_command_sentinel_exit_zero_means_required_and_one_means_not() -> None:
    assert (await CommandSentinel(["true"]).check())[0] is True
    assert (await CommandSentinel(["false"]).check())[0] is False


@pytest.mark.parametrize(
    "argv",
    [
        ["/nonexistent/needs-restarting"],  # cannot launch at all
        ["sh", "-c", "exit 127"],  # command not found
        ["sh", "-c", "exit 126"],  # found but not executable
    ],
)
async def test_a_sentinel_command_that_cannot_run_is_an_error_not_a_reboot(
    argv: list[str],
) -> None:
    with pytest.raises(SensorError):
        await CommandSentinel(argv).check()


async def test_kernel_sentinel_wants_a_reboot_into_a_newer_installed_kernel(
    tmp_path: Path,
) -> None:
    modules = tmp_path / "modules"
    for release in ("6.12.9-amd64", "6.12.10-amd64", "6.1.0-28-amd64"):
        (modules / release).mkdir(parents=True)
    older = KernelSentinel("6.12.9-amd64", modules, tmp_path / "boot")
    required, detail = await older.check()
    assert required
    assert "6.12.10-amd64" in detail
    newest = KernelSentinel("6.12.10-amd64", modules, tmp_path / "boot")
    assert (await newest.check())[0] is False
    assert kernel_version_key("6.12.10") > kernel_version_key("6.12.9")


async def test_any_sentinel_is_required_if_one_is(tmp_path: Path) -> None:
    path = tmp_path / "s"
    both = AnySentinel([FileSentinel(path), CommandSentinel(["false"])])
    assert (await both.check())[0] is False
    path.touch()
    assert (await both.check())[0] is True


def _alerts(*alerts: tuple[str, str]) -> dict[str, object]:
    return {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [
                {"metric": {"alertname": n, "alertstate": s}, "value": [0, "1"]} for n, s in alerts
            ],
        },
    }


@pytest.mark.parametrize(
    ("match_only", "regexp", "blocks"),
    [
        (False, "Pressure", False),  # ignore list: a matching alert does not block
        (False, "Other", True),  # ignore list: a non-matching alert blocks
        (True, "Pressure", True),  # block list: a matching alert blocks
        (True, "Other", False),  # block list: a non-matching alert does not block
        (False, None, True),  # no regexp: every alert blocks
        (True, None, True),
    ],
)
def test_alert_filter_truth_table_of_kured(
    match_only: bool, regexp: str | None, blocks: bool
) -> None:
    pattern = re.compile(regexp) if regexp else None
    names = active_alerts(_alerts(("NodeDiskPressure", "firing")), pattern, match_only, False)
    assert bool(names) is blocks


def test_alert_filter_is_an_unanchored_search_and_firing_only_drops_pending() -> None:
    data = _alerts(("KuredRebootRequired", "firing"), ("Flappy", "pending"))
    assert active_alerts(data, re.compile("RebootRequired"), True, False) == ["KuredRebootRequired"]
    assert active_alerts(data, None, False, True) == ["KuredRebootRequired"]
    assert active_alerts(data, None, False, False) == ["Flappy", "KuredRebootRequired"]


def test_a_non_vector_answer_is_an_error() -> None:
    with pytest.raises(SensorError):
        active_alerts({"status": "success", "data": {"resultType": "matrix"}}, None, False, False)
    with pytest.raises(SensorError):
        active_alerts({"status": "error", "error": "bad"}, None, False, False)


def test_host_namespace_auto_is_off_in_our_own_mount_namespace() -> None:
    # The test runs in the same mount namespace as this machine's PID 1 sees it (or cannot see
    # PID 1's at all): auto must not wrap the command in nsenter.
    import os

    from kured.actuators.reboot import CommandReboot, wants_host_namespace

    try:
        same = os.readlink("/proc/self/ns/mnt") == os.readlink("/proc/1/ns/mnt")
    except OSError:
        same = True
    assert wants_host_namespace("auto") is (not same)
    assert wants_host_namespace("true") is True
    assert wants_host_namespace("false") is False
    assert CommandReboot(["systemctl", "reboot"], host_namespace=True).argv[:3] == (
        "nsenter",
        "-m/proc/1/ns/mnt",
        "--",
    )
