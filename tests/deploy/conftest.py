"""Fixtures for the deploy/ tests: the rendered manifests, and the metric names the two programs
really export, read from the ``/metrics`` of a running ``kura serve`` and a running ``kured``
agent (not from the source), so an alert can only name what a scrape returns.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import node_env, spawn_node
from tests.deploy.kustomize import Manifest, render
from tests.deploy.promql import exposition_names

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KURED_LISTEN = re.compile(r"kured listening metrics=(http://\S+)")


@pytest.fixture(scope="session")
def manifests() -> list[Manifest]:
    return render(DEPLOY)


def _closed_port() -> int:
    """A port nothing listens on right now (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(url: str) -> str:
    # Twice: the first scrape is itself counted by the request metrics of the second.
    httpx.get(url, timeout=10)
    response = httpx.get(url, timeout=10)
    response.raise_for_status()
    return response.text


@pytest.fixture(scope="session")
def kura_exposition(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``/metrics`` of a real ``kura serve`` (one node, no peers: the per-peer families are
    declared by their ``# TYPE`` lines without samples)."""
    directory = tmp_path_factory.mktemp("kura-metrics")
    node = spawn_node(directory, node_env(directory))
    try:
        yield _scrape(node.url + "/metrics")
    finally:
        node.stop()


@pytest.fixture(scope="session")
def kured_exposition(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``/metrics`` of a real ``kured`` agent. Its etcd endpoint is a closed port: the lock
    cannot be read, which changes values (lock_unknown), not which families are exported."""
    directory = tmp_path_factory.mktemp("kured-metrics")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KURED_")}
    argv = [
        sys.executable,
        "-m",
        "kured.cli",
        "--node-id=conformance",
        f"--etcd-endpoints=http://127.0.0.1:{_closed_port()}",
        f"--reboot-sentinel={directory / 'reboot-required'}",
        f"--state-dir={directory / 'state'}",
        "--metrics-host=127.0.0.1",
        "--metrics-port=0",
    ]
    log_path = directory / "kured.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, text=True, env=env)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        m = KURED_LISTEN.search(line)
        if m is None:
            proc.kill()
            proc.wait()
            pytest.fail(f"kured did not start: {line!r}\n{log_path.read_text()}")
        yield _scrape(m.group(1) + "/metrics")
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


@pytest.fixture(scope="session")
def exported_metrics(kura_exposition: str, kured_exposition: str) -> set[str]:
    return exposition_names(kura_exposition) | exposition_names(kured_exposition)
