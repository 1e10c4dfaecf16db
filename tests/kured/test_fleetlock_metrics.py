"""``kured fleetlock`` as a user runs it (a real process, its semaphores in a real etcd): its
``/metrics`` follows the semaphores in etcd (slots, slots in use, holders per group) and says
when etcd cannot be read; and every one of its flags has help text."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from kura_harness.launch.etcd import Etcd
from kura_harness.launch.node import spawn_kured
from kura_harness.launch.process import free_port, stop
from kured.cli import fleetlock_parser
from tests import oneshot

HEADERS = {"fleet-lock-protocol": "true"}


def _samples(url: str) -> dict[str, float]:
    text = oneshot.get(url + "/metrics", timeout=10).text
    out = {}
    for line in text.splitlines():
        if line.startswith("kured_fleetlock_"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def test_fleetlock_metrics_follow_the_semaphores_in_etcd(etcd_server: Etcd, tmp_path: Path) -> None:
    port = free_port()
    proc, _ = spawn_kured(
        [
            "fleetlock",
            "--port",
            str(port),
            "--etcd-endpoints",
            etcd_server.url,
            "--group-slots",
            "workers=2",
        ],
        tmp_path / "fleetlock.log",
    )
    try:
        url = f"http://127.0.0.1:{port}"

        def call(path: str, client: str, group: str) -> int:
            body = {"client_params": {"id": client, "group": group}}
            return oneshot.post(
                f"{url}/v1/{path}", json=body, headers=HEADERS, timeout=10
            ).status_code

        before = _samples(url)
        assert before["kured_fleetlock_lock_store_up"] == 1
        assert before['kured_fleetlock_slots{group="workers"}'] == 2
        assert before['kured_fleetlock_slots_in_use{group="workers"}'] == 0
        assert before['kured_fleetlock_slots{group="default"}'] == 1
        assert call("pre-reboot", "w1", "workers") == 200
        assert call("pre-reboot", "w2", "workers") == 200
        assert call("pre-reboot", "c1", "default") == 200
        assert call("pre-reboot", "c2", "default") == 409
        held = _samples(url)
        assert held['kured_fleetlock_slots_in_use{group="workers"}'] == 2
        assert held['kured_fleetlock_slots_in_use{group="default"}'] == 1
        assert held['kured_fleetlock_holder_info{group="workers",holder="w1"}'] == 1
        assert held['kured_fleetlock_holder_info{group="workers",holder="w2"}'] == 1
        assert held['kured_fleetlock_holder_info{group="default",holder="c1"}'] == 1
        assert not any('holder="c2"' in name for name in held)  # refused: holds nothing
        assert call("steady-state", "w1", "workers") == 200
        after = _samples(url)
        assert after['kured_fleetlock_slots_in_use{group="workers"}'] == 1
        assert not any('holder="w1"' in name for name in after)
        # The same read, the same answer.
        status = oneshot.get(url + "/v1/status", timeout=10).json()
        assert [h["id"] for h in status["groups"]["workers"]["holders"]] == ["w2"]
        etcd_server.stop()
        down = _samples(url)
        assert down["kured_fleetlock_lock_store_up"] == 0
        assert not any("slots_in_use" in name for name in down)  # unknown, not "free"
    finally:
        stop(proc, timeout=10)


def test_every_fleetlock_flag_has_help_naming_its_environment_variable() -> None:
    parser = fleetlock_parser()
    flags = [a for a in parser._actions if not isinstance(a, argparse._HelpAction)]
    assert {a.option_strings[0] for a in flags} == {
        "--host",
        "--port",
        "--etcd-endpoints",
        "--prefix",
        "--default-slots",
        "--group-slots",
    }
    for action in flags:
        assert action.help, action.option_strings
        assert "env KURED_" in action.help, action.option_strings
    shown = subprocess.run(
        [sys.executable, "-m", "kured.cli", "fleetlock", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    for action in flags:
        assert action.help.split(" (")[0] in " ".join(shown.split()), action.option_strings
