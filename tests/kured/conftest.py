"""Fixtures for kured's tests: a real etcd server on 127.0.0.1, a real Alertmanager, and the
Kubernetes API double.

One etcd (Debian's ``etcd``, 3.4) serves the whole test run (``etcd_session``, started the
first time a test asks for it: about a second saved per test). Tests share it through a key
prefix each: ``etcd_prefix`` (``/test/<n>``, unique in the run), ``lock_key`` (the agents'
``--lock-key`` under it) and ``fleetlock_prefix`` (``kured fleetlock --prefix``). ``etcd`` (the
client URL) fails the test if, when it ends, etcd holds a key outside the prefixes handed out:
a test that writes kured's default ``/kured/lock`` would be seen by the next one.

``etcd_server`` (function scope) is a fresh etcd of the test's own, for a test that stops it.
Both fail the test, never skip it, when ``etcd`` is not installed: the lock tests are the proof
that the compare-and-swap holds, and a skipped proof looks like a passed one. The process is
started by ``kura_harness.launch.etcd`` (ports chosen by the OS, a failed start retried with new
ones, shortened election so a single member has a leader at once).
"""

from __future__ import annotations

import base64
import itertools
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from kura_harness.launch import LaunchError
from kura_harness.launch.alertmanager import Alertmanager
from kura_harness.launch.etcd import Etcd
from tests import oneshot
from tests.kured.k8s_double import KubeDouble

if TYPE_CHECKING:
    from tests.kured.kube_agent import KubeHost

ETCD_START_TIMEOUT_SECONDS = 30.0
ETCD_START_ATTEMPTS = 3
# Every key a test may write in the shared etcd starts with this.
TEST_KEYS = "/test/"
_numbers = itertools.count(1)


def _start_etcd(directory: Path) -> Etcd:
    try:
        return Etcd(
            directory, name="test", attempts=ETCD_START_ATTEMPTS, timeout=ETCD_START_TIMEOUT_SECONDS
        ).start()
    except LaunchError as exc:
        pytest.fail(f"{exc} (the tests need a real etcd: apt-get install etcd-server)")


@pytest.fixture(scope="session")
def etcd_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Etcd]:
    """The etcd every test of the run shares (through its own key prefix)."""
    server = _start_etcd(tmp_path_factory.mktemp("etcd"))
    try:
        yield server
    finally:
        server.stop()


def _keys(url: str) -> list[str]:
    """Every key in the etcd at ``url`` (its v3 JSON gateway; keys only)."""
    body = {"key": base64.b64encode(b"\0").decode(), "range_end": "AA==", "keys_only": True}
    answer = oneshot.post(url + "/v3/kv/range", json=body, timeout=10).json()
    return [base64.b64decode(kv["key"]).decode(errors="replace") for kv in answer.get("kvs", [])]


@pytest.fixture
def etcd_prefix() -> str:
    """This test's key prefix in the shared etcd, ``/test/<n>`` (no trailing slash)."""
    return f"{TEST_KEYS}{next(_numbers)}"


@pytest.fixture
def lock_key(etcd_prefix: str) -> str:
    """This test's ``--lock-key``."""
    return f"{etcd_prefix}/kured/lock"


@pytest.fixture
def fleetlock_prefix(etcd_prefix: str) -> str:
    """This test's ``kured fleetlock --prefix``."""
    return f"{etcd_prefix}/kured/fleetlock"


@pytest.fixture
def etcd(etcd_session: Etcd) -> Iterator[str]:
    """The shared etcd's client URL. The test fails if it leaves a key outside ``/test/``."""
    yield etcd_session.url
    strays = [key for key in _keys(etcd_session.url) if not key.startswith(TEST_KEYS)]
    for key in strays:  # the next test starts clean either way
        deleted = {"key": base64.b64encode(key.encode()).decode()}
        oneshot.post(etcd_session.url + "/v3/kv/deleterange", json=deleted, timeout=10)
    assert not strays, f"keys written outside the test's prefix (use lock_key): {strays}"


@pytest.fixture
def etcd_server(tmp_path: Path) -> Iterator[Etcd]:
    """A fresh single-member etcd of this test's own (``kura_harness.launch.etcd.Etcd``: ``url``,
    ``stop()``), for a test that stops it. Fails, never skips, if etcd is missing."""
    server = _start_etcd(tmp_path / "etcd")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[Alertmanager]:
    """A real Alertmanager of this test's own (Debian's ``prometheus-alertmanager``,
    ``kura_harness.launch.alertmanager``: ``url``, ``silences()``). Fails, never skips, when
    it is not installed: the silence tests are the proof that no silence is left behind."""
    try:
        server = Alertmanager(tmp_path / "alertmanager").start()
    except LaunchError as exc:
        pytest.fail(f"{exc} (the silence tests need a real Alertmanager)")
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
