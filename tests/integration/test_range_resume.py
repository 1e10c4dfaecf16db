"""A cut 1 GiB download resumed with a real client (``curl -C -``, i.e. ``Range: bytes=N-``)
against a real node gives a byte-identical file (api.partial_content)."""

from __future__ import annotations

import hashlib
import random
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import NodeProcess
from tests.e2e.mesh import wait_for

pytestmark = pytest.mark.in_process

MiB = 1024 * 1024
GiB = 1024 * MiB
CHUNK_BYTES = 4 * MiB


class _StreamedBody:
    """1 GiB of seeded pseudo-random bytes, generated chunk by chunk (never held in memory),
    hashing what it yields."""

    def __init__(self, size_bytes: int) -> None:
        self.size_bytes = size_bytes
        self.sha256 = hashlib.sha256()
        self._rng = random.Random(13)

    def __iter__(self) -> Iterator[bytes]:
        left = self.size_bytes
        while left:
            chunk = self._rng.randbytes(min(CHUNK_BYTES, left))
            self.sha256.update(chunk)
            left -= len(chunk)
            yield chunk


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            h.update(chunk)
    return h.hexdigest()


@pytest.mark.slow
def test_a_cut_1_gib_download_resumed_with_curl_is_byte_identical(
    node: NodeProcess, tmp_path: Path
) -> None:
    curl = shutil.which("curl")
    assert curl is not None, "curl is required (apt-get install curl)"
    body = _StreamedBody(GiB)
    with httpx.Client(base_url=node.url, timeout=300) as c:
        r = c.put(
            "/cache/big/artifact",
            content=iter(body),
            headers={"Content-Length": str(GiB)},
        )
        assert r.status_code == 201, r.text
    want = body.sha256.hexdigest()
    url = node.url + "/cache/big/artifact"
    out = tmp_path / "artifact.download"

    # The first transfer is slowed down so it can be cut mid-way, then killed.
    first = subprocess.Popen(
        [curl, "-sS", "--limit-rate", "200M", "-o", str(out), url],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert wait_for(lambda: out.exists() and out.stat().st_size >= 256 * MiB, 60)
    finally:
        first.kill()
        first.wait()
    cut_at = out.stat().st_size
    assert 0 < cut_at < GiB

    started = time.monotonic()
    resumed = subprocess.run(
        [curl, "-sS", "-C", "-", "-o", str(out), "-w", "%{http_code} %{size_download}", url],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    seconds = time.monotonic() - started
    status, downloaded = resumed.stdout.split()
    assert status == "206", resumed.stdout
    assert int(downloaded) == GiB - cut_at  # only the missing part came over the wire
    assert out.stat().st_size == GiB
    assert _sha256_file(out) == want
    print(f"cut at {cut_at} bytes; resumed {GiB - cut_at} bytes in {seconds:.2f} s")
