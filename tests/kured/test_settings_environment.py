"""The ``kured`` agent's environment (issue 26, item 11), real processes: a ``KURED_*`` variable
that names no flag stops the start naming the one meant; the service links of a Service
``kured`` or ``kured-metrics`` are ignored, even ``KURED_METRICS_PORT=tcp://...``, which shares
a flag's variable and, the environment winning in kured, would replace ``--metrics-port``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from kura_harness.launch.node import kured_env, spawn_kured
from kura_harness.launch.process import stop
from tests import oneshot


def agent_flags(tmp_path: Path) -> list[str]:
    """An agent that can never reboot anything: no sentinel, no reachable etcd."""
    boot_id = tmp_path / "boot_id"
    boot_id.write_text("00000000-0000-0000-0000-000000000001\n")
    return [
        "--node-id", "n1",
        "--etcd-endpoints", "http://127.0.0.1:1",
        "--reboot-sentinel", str(tmp_path / "never-created"),
        "--boot-id-file", str(boot_id), "--state-dir", str(tmp_path / "state"),
        "--metrics-port", "0", "--metrics-host", "127.0.0.1",
        "--reboot-command", "/bin/echo reboot",
    ]  # fmt: skip


def test_a_misspelt_kured_variable_stops_the_start_naming_the_one_meant(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kured.cli", *agent_flags(tmp_path)],
        env={**kured_env(), "KURED_REBOOT_DAY": "mon"},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "KURED_REBOOT_DAY is not a known setting: did you mean KURED_REBOOT_DAYS?" in done.stderr
    assert "KURED_ALLOW_UNKNOWN_SETTINGS=true" in done.stderr
    assert "Traceback" not in done.stderr


def test_kured_ignores_the_service_links_of_its_namespace(tmp_path: Path) -> None:
    links = {
        "KURED_SERVICE_HOST": "10.96.0.20",
        "KURED_SERVICE_PORT": "8080",
        "KURED_SERVICE_PORT_METRICS": "8080",
        "KURED_PORT": "tcp://10.96.0.20:8080",
        "KURED_PORT_8080_TCP": "tcp://10.96.0.20:8080",
        "KURED_PORT_8080_TCP_ADDR": "10.96.0.20",
        "KURED_PORT_8080_TCP_PORT": "8080",
        "KURED_PORT_8080_TCP_PROTO": "tcp",
        "KURED_METRICS_SERVICE_HOST": "10.96.0.21",
        "KURED_METRICS_PORT": "tcp://10.96.0.21:9100",  # a Service kured-metrics
    }
    log = tmp_path / "kured.log"
    proc, url = spawn_kured(agent_flags(tmp_path), log, env={**kured_env(), **links})
    try:
        assert oneshot.get(url + "/status", timeout=10).status_code == 200
        assert not url.endswith(":9100"), url  # --metrics-port 0, not the link's port
    finally:
        stop(proc, timeout=30)
    ignored = [line for line in log.read_text().splitlines() if "service-link" in line]
    assert len(ignored) == 1, log.read_text()
    assert f"ignoring {len(links)} Kubernetes service-link variables" in ignored[0]
