"""A peer or client that hangs up while a handler is still streaming to it is an ordinary event:
one INFO line and a 499 in the request counter, never an ERROR with a traceback (operators
alert on ERROR). The class: every handler that writes its own body (throttled peer downloads,
batched bootstrap bodies, changes pages) raises ConnectionResetError when the reader is gone.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable
from urllib.parse import urlsplit

import pytest

from kura.core.keys import artifact_id
from tests.conftest import NodeProcess
from tests.e2e.mesh import wait_for

pytestmark = pytest.mark.in_process

TOKEN = "gone-peer-token"


def test_a_peer_that_hangs_up_mid_download_is_not_an_error(
    start_node: Callable[..., NodeProcess],
) -> None:
    node = start_node(
        "gone",
        internal_tokens=TOKEN,
        replication_bandwidth_limit_bytes_per_second=64 * 1024,
    )
    with node.client() as c:
        assert c.put("/cache/big", content=b"x" * (4 * 1024 * 1024)).status_code == 201
    aid = artifact_id("http", "default", "", "big")
    host = urlsplit(node.internal_url)
    for _ in range(3):
        with socket.create_connection((host.hostname, host.port), timeout=10) as s:
            s.sendall(
                f"GET /_internal/bootstrap/artifacts/{aid} HTTP/1.1\r\nHost: x\r\n"
                f"Authorization: Bearer {TOKEN}\r\n\r\n".encode()
            )
            assert s.recv(4096).startswith(b"HTTP/1.1 200")
            # Close with unread data queued: the kernel answers the node's next write with RST.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    # All three hang-ups are logged once handled; nothing more is written for them.
    assert wait_for(lambda: node.log_path.read_text().count("client went away") >= 3, timeout=30)
    log = node.log_path.read_text()
    assert "Traceback" not in log, log[-3000:]
    assert " ERROR " not in log, log[-3000:]
    counted = node.metrics()
    assert any("499" in k and "internal" in k for k in counted), sorted(counted)[:40]
