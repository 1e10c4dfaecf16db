"""Fixtures for the deploy/ tests: the rendered manifests, and the metric names the two programs
really export, read from the ``/metrics`` of a running ``kura serve`` and a running ``kured``
agent (not from the source), so an alert can only name what a scrape returns.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kura_harness.launch import LaunchError
from kura_harness.launch.node import spawn_kured
from kura_harness.launch.process import free_port, stop
from tests import oneshot
from tests.conftest import node_env, spawn_node
from tests.deploy.kustomize import Manifest, render
from tests.deploy.promql import exposition_names

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


@pytest.fixture(scope="session")
def manifests() -> list[Manifest]:
    return render(DEPLOY)


def _scrape(url: str) -> str:
    # Twice: the first scrape is itself counted by the request metrics of the second.
    oneshot.get(url, timeout=10)
    response = oneshot.get(url, timeout=10)
    response.raise_for_status()
    return response.text


@pytest.fixture(scope="session")
def kura_exposition(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``/metrics`` of a real ``kura serve`` (one node, no peers: the per-peer families are
    declared by their ``# TYPE`` lines without samples) with a worker process, as a node
    deployed on two cores or more runs (``KURA_WORKERS=auto``): it adds the ``kura_worker*``
    families (test nodes run one process unless told)."""
    directory = tmp_path_factory.mktemp("kura-metrics")
    node = spawn_node(directory, node_env(directory, workers=2))
    try:
        yield _scrape(node.url + "/metrics")
    finally:
        node.stop()


@pytest.fixture(scope="session")
def kura_tier_exposition(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``/metrics`` of a real ``kura serve`` with an object-storage tier, bucket expiry and the
    gRPC port, which add the ``kura_object_store_*``, ``kura_expiry_bucket_*`` and
    ``kura_grpc_*`` families. Its store is a closed port: uploads would fail, which changes
    values, not which families are exported."""
    directory = tmp_path_factory.mktemp("kura-tier-metrics")
    env = node_env(directory, object_store_url="s3://conformance/kura", max_age="1d", grpc_port=0)
    env.update(
        AWS_ENDPOINT_URL=f"http://127.0.0.1:{free_port()}",
        AWS_ACCESS_KEY_ID="conformance",
        AWS_SECRET_ACCESS_KEY="conformance",
        AWS_REGION="us-east-1",
        AWS_ALLOW_HTTP="true",
    )
    node = spawn_node(directory, env)
    try:
        yield _scrape(node.url + "/metrics")
    finally:
        node.stop()


@pytest.fixture(scope="session")
def kured_exposition(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``/metrics`` of a real ``kured`` agent. Its etcd endpoint is a closed port: the lock
    cannot be read, which changes values (lock_unknown), not which families are exported."""
    directory = tmp_path_factory.mktemp("kured-metrics")
    flags = [
        "--node-id=conformance",
        f"--etcd-endpoints=http://127.0.0.1:{free_port()}",
        f"--reboot-sentinel={directory / 'reboot-required'}",
        f"--state-dir={directory / 'state'}",
        "--metrics-host=127.0.0.1",
        "--metrics-port=0",
    ]
    try:
        proc, url = spawn_kured(flags, directory / "kured.log")
    except LaunchError as exc:
        pytest.fail(str(exc))
    try:
        yield _scrape(url + "/metrics")
    finally:
        stop(proc, timeout=10)


@pytest.fixture(scope="session")
def exported_metrics(
    kura_exposition: str, kura_tier_exposition: str, kured_exposition: str
) -> set[str]:
    return (
        exposition_names(kura_exposition)
        | exposition_names(kura_tier_exposition)
        | exposition_names(kured_exposition)
    )
