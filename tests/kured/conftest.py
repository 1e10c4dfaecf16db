"""Fixtures for kured's tests: a real etcd server on 127.0.0.1, and the Kubernetes API double.

``etcd`` (function scope) starts Debian's ``etcd`` (3.4) as a subprocess with a fresh data dir
under the test's tmp_path and free ports, waits until ``/health`` answers ``{"health":"true"}``,
yields its client URL (``http://127.0.0.1:<port>``) and stops it when the test ends. It fails
the test, never skips it, when ``etcd`` is not installed: the lock tests are the proof that the
compare-and-swap holds, and a skipped proof looks like a passed one.

The process is started by ``kura.demo.launch.etcd`` (ports chosen by the OS, a failed start
retried with new ones, shortened election so a single member has a leader at once).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from kura.demo.launch import LaunchError
from kura.demo.launch.etcd import Etcd
from tests.kured.k8s_double import KubeDouble

if TYPE_CHECKING:
    from tests.kured.kube_agent import KubeHost

ETCD_START_TIMEOUT_SECONDS = 30.0
ETCD_START_ATTEMPTS = 3


@pytest.fixture
def etcd(etcd_server: Etcd) -> str:
    """A running single-member etcd; its client URL. Fails if etcd is missing."""
    return etcd_server.url


@pytest.fixture
def etcd_server(tmp_path: Path) -> Iterator[Etcd]:
    """A running single-member etcd (``kura.demo.launch.etcd.Etcd``: ``url``, ``stop()``).
    Fails, never skips, if etcd is missing or does not start."""
    try:
        server = Etcd(
            tmp_path / "etcd",
            name="test",
            attempts=ETCD_START_ATTEMPTS,
            timeout=ETCD_START_TIMEOUT_SECONDS,
        ).start()
    except LaunchError as exc:
        pytest.fail(f"{exc} (the tests need a real etcd: apt-get install etcd-server)")
    try:
        yield server
    finally:
        server.stop()


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


@pytest.fixture
async def hosts(tmp_path: Path, kubeconfig: Path) -> AsyncIterator[Callable[..., KubeHost]]:
    """``hosts(node_id, **KubeHost options)``: in-process agents wired as ``kured.app`` does
    for ``--lock-backend=kubernetes`` against ``kube`` (tests/kured/kube_agent.py); every
    client closed at the end."""
    from tests.kured.kube_agent import KubeHost  # it imports this module's constants

    made: list[KubeHost] = []

    def make(node_id: str, **options: object) -> KubeHost:
        host = KubeHost(tmp_path, node_id, kubeconfig, **options)  # type: ignore[arg-type]
        made.append(host)
        return host

    yield make
    for host in made:
        await host.close()
