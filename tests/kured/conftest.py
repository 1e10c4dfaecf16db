"""Fixtures for kured's tests: a real etcd server on 127.0.0.1, and the Kubernetes API double.

``etcd`` (function scope) starts Debian's ``etcd`` (3.4) as a subprocess with a fresh data dir
under the test's tmp_path and free ports, waits until ``/health`` answers ``{"health":"true"}``,
yields its client URL (``http://127.0.0.1:<port>``) and stops it when the test ends. It fails
the test, never skips it, when ``etcd`` is not installed: the lock tests are the proof that the
compare-and-swap holds, and a skipped proof looks like a passed one.

Ports: the OS picks them (bind port 0, read it, close) and etcd binds them a moment later;
another process can take one in between, so a start that fails is retried with new ports.
Election and heartbeat are shortened so a single-member cluster has a leader within a fraction
of a second instead of the default ~1 s.
"""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kured.k8s_double import KubeDouble

ETCD_START_TIMEOUT_SECONDS = 30.0
ETCD_START_ATTEMPTS = 3


def _free_ports(count: int) -> list[int]:
    """``count`` distinct ports the OS considers free right now (all held until all chosen)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=1) as response:
            return bool(json.loads(response.read()).get("health") == "true")
    except (OSError, ValueError, urllib.error.URLError):
        return False


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _start_etcd(
    executable: str, directory: Path, attempt: int
) -> tuple[subprocess.Popen[bytes], str, Path]:
    client_port, peer_port = _free_ports(2)
    client_url = f"http://127.0.0.1:{client_port}"
    peer_url = f"http://127.0.0.1:{peer_port}"
    log_path = directory / f"etcd-{attempt}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [
                executable,
                "--name=test",
                f"--data-dir={directory / f'data-{attempt}'}",
                f"--listen-client-urls={client_url}",
                f"--advertise-client-urls={client_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=test={peer_url}",
                "--initial-cluster-state=new",
                "--heartbeat-interval=50",
                "--election-timeout=250",
                "--log-level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    return proc, client_url, log_path


class EtcdServer:
    """A running etcd: ``url`` and ``stop()`` (to make it unreachable in a test)."""

    def __init__(self, proc: subprocess.Popen[bytes], url: str) -> None:
        self.proc = proc
        self.url = url

    def stop(self) -> None:
        _stop(self.proc)


@pytest.fixture
def etcd(etcd_server: EtcdServer) -> str:
    """A running single-member etcd; its client URL. Fails if etcd is missing."""
    return etcd_server.url


@pytest.fixture
def etcd_server(tmp_path: Path) -> Iterator[EtcdServer]:
    """A running single-member etcd (``EtcdServer``). Fails if etcd is missing."""
    executable = shutil.which("etcd")
    if executable is None:
        pytest.fail(
            "etcd is not installed: apt-get install etcd-server (the tests need a real one)"
        )
    directory = tmp_path / "etcd"
    directory.mkdir()
    logs: list[str] = []
    for attempt in range(ETCD_START_ATTEMPTS):
        proc, url, log_path = _start_etcd(executable, directory, attempt)
        deadline = time.monotonic() + ETCD_START_TIMEOUT_SECONDS
        while time.monotonic() < deadline and proc.poll() is None and not _healthy(url):
            time.sleep(0.05)
        if proc.poll() is None and _healthy(url):
            break
        _stop(proc)
        logs.append(log_path.read_text(errors="replace")[-3000:])
    else:
        pytest.fail("etcd did not start:\n" + "\n---\n".join(logs))
    try:
        yield EtcdServer(proc, url)
    finally:
        _stop(proc)


# --- the Kubernetes API server double (no API server runs here: tests/kured/k8s_double.py) ---

LOCK_NAMESPACE = "kube-system"
LOCK_DAEMONSET = "kured"
LOCK_ANNOTATION = "weave.works/kured-node-lock"


@pytest.fixture
def kube() -> Iterator[KubeDouble]:
    """A running Kubernetes API double with kured's DaemonSet (kube-system/kured)."""
    with KubeDouble() as double:
        double.add_daemonset(LOCK_NAMESPACE, LOCK_DAEMONSET)
        yield double


@pytest.fixture
def kubeconfig(kube: KubeDouble, tmp_path: Path) -> Path:
    """A kubeconfig file for ``kube`` (plain http, bearer token), as a user would write it."""
    return kube.kubeconfig(tmp_path / "kubeconfig")
