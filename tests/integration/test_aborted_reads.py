"""Verification work for a GET is bounded by what the GET costs (issue 26): a client that hangs
up after the first bytes of a large blob stops the hash of that blob, and concurrent GETs of
the same stored file share one hash, so aborted downloads cannot queue whole-file hashes in
the verify pool ahead of everyone else's reads (``storage.verify.ReadVerifier.digest``)."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import pytest

from tests.conftest import NodeProcess
from tests.integration.test_ranges import read_syscall_bytes

pytestmark = pytest.mark.in_process

MiB = 1024 * 1024


def _aborted_get(node: NodeProcess, path: str) -> None:
    """GET ``path``, read the first bytes of the answer, hang up with a reset."""
    url = urlsplit(node.url)
    with socket.create_connection((url.hostname, url.port), timeout=30) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert s.recv(4096).startswith(b"HTTP/1.1 200")
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def test_aborted_gets_of_a_large_blob_do_not_hash_it_for_nobody(
    start_node: Callable[..., NodeProcess],
) -> None:
    """40 GETs of a 256 MiB blob that hang up after 4 KiB, then a GET of an 8 MiB blob. Before:
    each aborted GET hashed all 256 MiB in the verify pool (9.9 GiB read) and the small GET
    waited behind them; now the hashes stop with their clients (0.5 GiB read)."""
    node = start_node(process=True)  # its own /proc/PID/io (read_syscall_bytes)
    big = bytes(range(256)) * (MiB // 256) * 256
    small = b"s" * (8 * MiB)
    with node.client() as c:
        assert c.put("/cache/r/big", content=big).status_code == 201
        assert c.put("/cache/r/small", content=small).status_code == 201
        before = read_syscall_bytes(node)
        with ThreadPoolExecutor(8) as pool:
            for _round in range(5):
                list(pool.map(lambda _i: _aborted_get(node, "/cache/r/big"), range(8)))
        started = time.monotonic()
        r = c.get("/cache/r/small")
        took = time.monotonic() - started
        read = read_syscall_bytes(node) - before
    assert r.status_code == 200
    assert r.content == small
    # Each aborted GET may read what the socket buffers took (sendfile) and a few blocks of
    # hash: together well under 5 times the blob, against 40 times before.
    figures = f"{read / MiB:.0f} MiB read for 40 aborted GETs, the small GET took {took:.1f} s"
    assert read < 5 * len(big), figures
    assert took < 3.0, figures
